"""What a run prints for people and for batch jobs' logs: progress while models load, the start-up
banner (trainer/banner.py), and (records/metrics_log.py) a line per iteration. Only the main process prints; every line is
flushed, so ``ppo-lm train … > log 2>&1`` shows the run as it goes."""

from __future__ import annotations

import contextlib
import time

from torch import nn

from ..runtime import distributed as dist


def say(message: str) -> None:
    if dist.is_main():
        print(message, flush=True)


@contextlib.contextmanager
def loading(what: str, source: str):
    """``loading the policy from DIR …`` then ``loaded the policy in 12.3 s``: a big model takes
    minutes to load, and a silent process looks hung. Two whole lines, as libraries may draw their own
    progress bars in between."""
    t0 = time.perf_counter()
    say(f"loading {what} from {source} …")
    yield
    say(f"loaded {what} in {time.perf_counter() - t0:.1f} s")


def parameters(model: nn.Module | None) -> str:
    """``'1.23 M (trained)'``-style count of a model's parameters."""
    if model is None:
        return "none"
    total = sum(p.numel() for p in model.parameters())
    trained = sum(p.numel() for p in model.parameters() if p.requires_grad)
    size = f"{total / 1e9:.2f} B" if total >= 1e9 else f"{total / 1e6:.2f} M"
    state = "trained" if trained == total else "frozen" if trained == 0 else f"{trained / total:.0%} trained"
    return f"{size} parameters, {state}"
