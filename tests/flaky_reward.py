"""A verifier that fails on rank 1 at its second call: for the rank-crash test."""

import os

_calls = {"n": 0}


def crash_on_rank1(prompts, responses, **columns):
    _calls["n"] += 1
    if os.environ.get("RANK") == "1" and _calls["n"] >= 2:
        raise RuntimeError("injected failure on rank 1")
    return [r.count("7") / 4 for r in responses]
