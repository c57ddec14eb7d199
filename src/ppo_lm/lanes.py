"""Independent shares of the work side by side on a multi-core CPU.

On a CPU every PyTorch op splits its work over the intra-op threads and joins them again; between
ops — in Python, in the autograd engine, in small ops that do not split — the other cores wait. Work
that splits into independent shares (the rows of an update micro-batch, each lane returning its own
gradients; the rows of a scoring forward) can instead run at the same time, each share on its own
OS thread with its part of the intra-op threads, so that one fills the other's gaps. On W1 (2 cores)
an iteration ran ≈ 8 % faster this way (docs/benchmarks.md).

Why it is safe: ops release the GIL; the autograd engine runs a CPU backward on the thread that calls
``backward``; grad mode and inference mode are thread-local (each task enters its own); the tasks
given to :meth:`Lanes.run` write disjoint outputs (their own gradient tensors, their own rows).
Results equal the one-at-a-time order's up to float rounding (a matmul on fewer threads may sum in
another order).

Only for CPU tensors in a single process: on a GPU the device, not the host threads, does the work;
under torch.distributed each thread would issue collectives in its own order (the ranks must agree).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from typing import TypeVar

import torch
from torch import Tensor

T = TypeVar("T")

# Below this many hidden-state elements (rows × tokens × hidden size) per share, handing work to
# another thread costs more than it saves: the demo's model (hidden 64, ≈ 32 k per share) updated
# 16 % slower on two lanes, W2's packed minibatches (≈ 200 k) 6 % faster, W1's (≈ 400 k) 8 %.
MIN_SHARE_ELEMENTS = 1 << 17

_inside = threading.local()  # .lane: this thread is running a lane's task


class Lanes:
    """Runs up to ``lanes`` tasks at once: the first on the caller's thread, the others on worker
    threads, each with its share of the caller's intra-op threads; ``lanes == 1`` runs them in order.
    ``threads`` (default: torch's count now) caps the number of lanes."""

    def __init__(self, lanes: int, threads: int | None = None):
        self.lanes = max(1, min(lanes, threads or torch.get_num_threads()))
        self._pool = None
        if self.lanes > 1:
            self._pool = ThreadPoolExecutor(self.lanes - 1, thread_name_prefix="ppo-lm-lane")

    def split(self, rows: int, tokens_per_row: int, hidden: int) -> int:
        """Into how many shares to split a forward over ``rows`` × ``tokens_per_row`` tokens of a model
        with this hidden size: as many as there are lanes while each share stays big enough."""
        n = min(self.lanes, rows)
        while n > 1 and rows * tokens_per_row * hidden < n * MIN_SHARE_ELEMENTS:
            n -= 1
        return max(n, 1)

    def shares(self, rows: Tensor, tokens_per_row: int, hidden: int) -> list[Tensor]:
        """``rows`` (in length order) dealt in turn into :meth:`split` shares of about equal cost."""
        n = self.split(rows.numel(), tokens_per_row, hidden)
        return [rows[i::n] for i in range(n)]

    def run(self, tasks: Sequence[Callable[[], T]]) -> list[T]:
        """Results of ``tasks`` (at most ``lanes``) in order. With several lanes they run concurrently
        and the caller's thread count is restored afterwards; a task's exception is raised here once
        every task has finished (none is left writing into shared outputs)."""
        if self._pool is None or len(tasks) < 2 or getattr(_inside, "lane", False):
            return [t() for t in tasks]  # (inside a lane's task the pool's workers are busy: in order)
        if len(tasks) > self.lanes:
            raise ValueError(f"{len(tasks)} tasks for {self.lanes} lanes")
        threads = torch.get_num_threads()  # the caller's, read now: it may have changed since __init__
        if threads < len(tasks):  # fewer threads than tasks now: one after the other
            return [t() for t in tasks]
        share = threads // len(tasks)

        def on_lane(task: Callable[[], T]) -> T:
            torch.set_num_threads(share)  # this thread's OpenMP/MKL team
            _inside.lane = True
            try:
                return task()
            finally:
                _inside.lane = False

        futures = [self._pool.submit(on_lane, t) for t in tasks[1:]]
        try:
            first = on_lane(tasks[0])
        finally:
            try:
                wait(futures)  # none is left running, even when the caller's task failed
            finally:
                torch.set_num_threads(threads)  # even when the wait is interrupted
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
