"""Wall seconds of the named phases of an iteration (``generate_s``, ``score_s``, ``update_s``, …), and
the rates they give."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

from torch import Tensor

from . import distributed as dist


class Timer:
    """``with timer("update_s"): ...`` adds the block's wall seconds to ``timer.seconds["update_s"]``."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.start = time.perf_counter()

    @contextlib.contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - t0

    def since_start(self) -> float:
        """Seconds since the timer was made (the iteration's wall time)."""
        return time.perf_counter() - self.start


def throughput(timer: Timer, mask: Tensor, n_episodes: int, *, epochs: int, asynchronous: bool = False,
               sampled_s: float | None = None) -> dict[str, float]:
    """The iteration's phase timings and rates: tokens of ``mask`` (B, T) over the global batch,
    ``n_episodes`` global, ``epochs`` passes of the update over them. ``iteration_s`` is the learner's wall
    clock from taking the batch to publishing the weights, waits included, and ``episodes_per_s`` is on
    it; ``rollout_tokens_per_s`` is on the sampler's clock: ``generate_s``, or ``sampled_s`` where a
    producer process sampled (``asynchronous``: the learner's ``generate_s`` is then its wait for the
    batch; without ``sampled_s`` — a batch a checkpoint kept — no rate)."""
    s = {"generate_s": 0.0, "score_s": 0.0, **timer.seconds, "iteration_s": timer.since_start()}
    tokens = float(dist.all_reduce_sum(mask.sum().float()))
    if not asynchronous:
        s["rollout_tokens_per_s"] = tokens / max(s["generate_s"], 1e-9)
    elif sampled_s is not None:
        s["rollout_tokens_per_s"] = tokens / max(sampled_s, 1e-9)
    s["update_tokens_per_s"] = tokens * epochs / max(s["update_s"], 1e-9)
    s["episodes_per_s"] = n_episodes / max(s["iteration_s"], 1e-9)
    s["rollout_s"] = s["generate_s"] + s["score_s"]
    return s
