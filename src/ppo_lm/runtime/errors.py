"""The one base class of every error a user can cause or fix: a bad setting, a missing or damaged
file, a reward function that fails. The commands print such an error as one line and exit with
status 2 (docs/errors.md lists every case); anything else is a bug and keeps its traceback."""

from __future__ import annotations

import argparse


class UserError(Exception):
    """A condition the user caused or can fix; its message names what is wrong and the fix."""


class ConfigError(UserError, ValueError):
    """A configuration value is invalid; the message names the field."""


class UsageError(UserError):
    """A bad command-line flag or value of a command parsed with :class:`ArgumentParser`."""


class ArgumentParser(argparse.ArgumentParser):
    """``argparse`` whose errors (unknown flag, invalid choice, not a number) are a :class:`UsageError`,
    so the command prints them as its other errors: one line, status 2 (``--help`` still exits 0)."""

    def error(self, message: str):  # type: ignore[override]
        raise UsageError(f"{message} (see `{self.prog} --help`)")
