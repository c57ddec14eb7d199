"""Parse a ``ppo-lm`` command line as the command would, and stop there: nothing loads, trains or writes.

The documentation shows commands a reader copies; tests/test_docs.py parses each one with today's flags
so that a renamed or removed flag fails a test instead of a reader. Every command parses its flags
before it does anything (``tyro.cli`` over its config dataclass for train, sft, rm and demo; the
package's ``ArgumentParser`` for the others), so stopping at the first of those calls to return what it
parsed runs exactly the parsing the command runs, with no second copy of any command's flags to drift.
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Iterator
from dataclasses import dataclass


class _Parsed(BaseException):
    """Raised right after a command's flags parse. A BaseException, so that no command's own error
    handling (``except Exception``, ``_run``'s ``except UserError``) mistakes it for a failure."""

    def __init__(self, value: object):
        super().__init__()
        self.value = value


@dataclass
class ParseResult:
    """``ok``: the flags parsed (``--help`` too); ``value``: the parsed config or namespace (None for
    ``--help``); ``output``: what the parser printed (its error, or the help)."""

    ok: bool
    value: object
    output: str


@contextlib.contextmanager
def _stop_after_parsing() -> Iterator[None]:
    import tyro

    from ..runtime.errors import ArgumentParser

    tyro_cli, parse_args = tyro.cli, ArgumentParser.parse_args

    def stop_tyro(*args, **kwargs):
        raise _Parsed(tyro_cli(*args, **kwargs))

    def stop_argparse(self, *args, **kwargs):
        raise _Parsed(parse_args(self, *args, **kwargs))

    tyro.cli, ArgumentParser.parse_args = stop_tyro, stop_argparse
    try:
        yield
    finally:
        tyro.cli, ArgumentParser.parse_args = tyro_cli, parse_args


def parse_only(argv: list[str]) -> ParseResult:
    """Parse ``ppo-lm ARGV`` (``argv`` without the program name) as :func:`ppo_lm.cli.main.main` would.
    A command's own checks after parsing (files that must exist, values that must agree) do not run:
    they need the reader's files, not today's flags."""
    from .main import main

    out = io.StringIO()
    with _stop_after_parsing(), contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        try:
            status = main(list(argv))
        except _Parsed as parsed:
            return ParseResult(True, parsed.value, out.getvalue())
        except SystemExit as e:  # a parser's error (status 2) or its --help (status 0)
            return ParseResult(e.code in (0, None), None, out.getvalue())
    # main returned without parsing: the command list (status 0), an unknown command or a UsageError (2)
    return ParseResult(status == 0, None, out.getvalue())
