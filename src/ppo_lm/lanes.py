"""Independent model computations side by side on a multi-core CPU.

On a CPU every PyTorch op splits its work over the intra-op threads and joins them again; between
ops — in Python, in the autograd engine, in small ops that do not split — the other cores wait. Two
computations that share nothing (the policy's and the critic's forward/backward in the update; two
halves of the rows through the frozen scoring models) can instead run at the same time, each on its
own OS thread with its share of the intra-op threads, so that one fills the other's gaps. On W1
(2 cores) the policy + critic update ran ≈ 7–10 % faster this way (docs/benchmarks.md).

Why it is safe: ops release the GIL; the autograd engine runs a CPU backward on the thread that calls
``backward``; grad mode and inference mode are thread-local (each task enters its own); the tasks
given to :meth:`Lanes.run` touch disjoint parameters, gradients and output rows. Results equal the
one-at-a-time order's up to float rounding (a matmul on fewer threads may sum in another order).

Only for CPU tensors in a single process: on a GPU the device, not the host threads, does the work;
under torch.distributed each thread would issue collectives in its own order (the ranks must agree).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import torch

T = TypeVar("T")


class Lanes:
    """Runs up to ``lanes`` tasks at once: the first on the caller's thread, the others on worker
    threads, each with ``threads // lanes`` intra-op threads; ``lanes == 1`` runs them in order."""

    def __init__(self, lanes: int, threads: int | None = None):
        threads = threads or torch.get_num_threads()
        self.lanes = max(1, min(lanes, threads))
        self.threads = threads
        self._pool = None
        if self.lanes > 1:
            self._pool = ThreadPoolExecutor(self.lanes - 1, thread_name_prefix="ppo-lm-lane")

    def run(self, tasks: Sequence[Callable[[], T]]) -> list[T]:
        """Results of ``tasks`` (at most ``lanes``) in order. With several lanes they run concurrently
        and the caller's thread count is restored afterwards; a task's exception is raised here once
        every task has finished (none is left writing into shared outputs)."""
        if self._pool is None or len(tasks) < 2:
            return [t() for t in tasks]
        if len(tasks) > self.lanes:
            raise ValueError(f"{len(tasks)} tasks for {self.lanes} lanes")
        share = max(1, self.threads // len(tasks))

        def on_lane(task: Callable[[], T]) -> T:
            torch.set_num_threads(share)  # this thread's OpenMP/MKL team
            return task()

        futures = [self._pool.submit(on_lane, t) for t in tasks[1:]]
        try:
            first = on_lane(tasks[0])
        finally:
            for f in futures:
                f.exception()  # waits
            torch.set_num_threads(self.threads)
        return [first] + [f.result() for f in futures]

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None


def resolve_lanes(requested: int, device: torch.device, distributed: bool) -> int:
    """How many lanes to use: ``requested`` on CPU in a single process, else 1 (see module doc)."""
    if device.type != "cpu" or distributed:
        return 1
    return max(1, min(requested, torch.get_num_threads()))
