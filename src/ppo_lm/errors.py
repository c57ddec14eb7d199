"""The one base class of every error a user can cause or fix: a bad setting, a missing or damaged
file, a reward function that fails. The commands print such an error as one line and exit with
status 2 (docs/errors.md lists every case); anything else is a bug and keeps its traceback."""

from __future__ import annotations


class UserError(Exception):
    """A condition the user caused or can fix; its message names what is wrong and the fix."""
