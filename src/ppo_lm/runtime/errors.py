"""The one base class of every error a user can cause or fix: a bad setting, a missing or damaged
file, a reward function that fails. The commands print such an error as one line and exit with
status 2 (docs/errors.md lists every case); anything else is a bug and keeps its traceback."""

from __future__ import annotations

import argparse
import sys


class UserError(Exception):
    """A condition the user caused or can fix; its message names what is wrong and the fix."""


class ConfigError(UserError, ValueError):
    """A configuration value is invalid; the message names the field."""


class UsageError(UserError):
    """A bad command-line flag or value of a command parsed with :class:`ArgumentParser`."""


class ArgumentParser(argparse.ArgumentParser):
    """``argparse`` whose errors (unknown flag, invalid choice, not a number) are a :class:`UsageError`,
    so the command prints them as its other errors: one line, status 2 (``--help`` still exits 0); and
    whose switches (``store_true``) also take a boolean spelt as in YAML, as the config's flags do
    (``--overwrite``, ``--overwrite yes``, ``--overwrite=false``)."""

    def error(self, message: str):  # type: ignore[override]
        raise UsageError(f"{message} (see `{self.prog} --help`)")

    def parse_known_args(self, args=None, namespace=None):  # type: ignore[override]
        from .settings import respell_booleans

        switches = {s for a in self._actions if isinstance(a, argparse._StoreTrueAction) for s in a.option_strings}
        args = sys.argv[1:] if args is None else list(args)
        spelling = lambda flag: (lambda on: [flag] if on else []) if flag in switches else None  # noqa: E731
        return super().parse_known_args(respell_booleans(args, spelling), namespace)
