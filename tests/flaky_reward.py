"""Verifiers that fail on purpose: on rank 1 at its second call (the rank-crash test), or at a given call."""

import os

_calls = {"n": 0}


def crash_on_rank1(prompts, responses, **columns):
    _calls["n"] += 1
    if os.environ.get("RANK") == "1" and _calls["n"] >= 2:
        raise RuntimeError("injected failure on rank 1")
    return [r.count("7") / 4 for r in responses]


def sevens_crash_at(prompts, responses, **columns):
    """The share of '7's; raises at call ``CRASH_AT`` (an environment variable) where it is set."""
    _calls["n"] += 1
    if os.environ.get("CRASH_AT") == str(_calls["n"]):
        raise RuntimeError(f"injected failure at call {_calls['n']}")
    return [r.count("7") / 4 for r in responses]
