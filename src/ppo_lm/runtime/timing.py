"""Wall seconds of the named phases of an iteration (``generate_s``, ``score_s``, ``update_s``, …)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator


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
