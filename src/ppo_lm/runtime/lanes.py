"""Independent shares of the work side by side on a multi-core CPU.

On a CPU every PyTorch op splits its work over the intra-op threads and joins them again; between
ops — in Python, in the autograd engine, in small ops that do not split — the other cores wait. Work
that splits into independent shares (the rows of an update micro-batch, each lane returning its own
gradients; the rows of a scoring forward) can instead run at the same time, each share on its own
OS thread with its part of the intra-op threads, so that one fills the other's gaps (measured in
docs/benchmarks.md).

The rest of the package sees three calls, each made as it would make one forward (and backward) over
the rows: :meth:`Lanes.map_rows` (scoring), :meth:`Lanes.accumulate` (the update's forwards and
backwards over the rows of a micro-batch) and :meth:`Lanes.backward` (the one backward call the
update makes per loss: ``loss.backward()``, or on a share of several, into the share's own gradients);
with one lane, or rows too few to pay, the work runs inline.

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
from torch import Tensor, nn

T = TypeVar("T")

# Below this many hidden-state elements (rows × tokens × hidden size) per share, handing work to
# another thread costs more than it saves (the demo's tiny model ran slower on two lanes; the
# benchmark workloads' minibatches, a few times bigger, faster: docs/benchmarks.md).
MIN_SHARE_ELEMENTS = 1 << 17

_inside = threading.local()  # .lane: this thread runs a lane's task; .grads: where its backward writes


class Lanes:
    """Runs up to ``lanes`` tasks at once: the first on the caller's thread, the others on worker
    threads, each with its share of the caller's intra-op threads; ``lanes == 1`` runs them in order.
    ``threads`` (default: torch's count now) caps the number of lanes. ``hidden``: the hidden size
    of the models whose forwards are shared (what a row's token costs, for :meth:`split`)."""

    def __init__(self, lanes: int, threads: int | None = None, *, hidden: int = 0):
        self.lanes = max(1, min(lanes, threads or torch.get_num_threads()))
        self.hidden = hidden
        self._pool = None
        if self.lanes > 1:
            self._pool = ThreadPoolExecutor(self.lanes - 1, thread_name_prefix="ppo-lm-lane")

    def split(self, rows: int, tokens_per_row: int, hidden: int | None = None) -> int:
        """Into how many shares to split a forward over ``rows`` × ``tokens_per_row`` tokens of a model
        with this hidden size: as many as there are lanes while each share stays big enough."""
        hidden = self.hidden if hidden is None else hidden
        n = min(self.lanes, rows)
        while n > 1 and rows * tokens_per_row * hidden < n * MIN_SHARE_ELEMENTS:
            n -= 1
        return max(n, 1)

    def shares(self, rows: Tensor, lengths: Tensor, prompt_width: int) -> list[Tensor]:
        """``rows`` by decreasing response length (``lengths``, one per row), dealt in turn into
        :meth:`split` shares of about equal cost."""
        order = rows[lengths.argsort(descending=True, stable=True)]
        n = self.split(rows.numel(), prompt_width + int(lengths.max()))
        return [order[i::n] for i in range(n)]

    def map_rows(self, fn: Callable[[Tensor], T], rows: Tensor, lengths: Tensor, prompt_width: int) -> list[T]:
        """``fn(share)`` for :meth:`shares` of ``rows``, side by side; the shares' results in order.
        ``fn`` must write only its own rows of any shared output."""
        return self.run([lambda r=r: fn(r) for r in self.shares(rows, lengths, prompt_width)])

    def accumulate(self, fn: Callable[[Tensor], T], rows: Tensor, lengths: Tensor, prompt_width: int) -> list[T]:
        """``fn(share)`` for :meth:`shares` of ``rows``, side by side, where ``fn`` runs its forwards and
        calls :meth:`backward` for each loss. Afterwards every parameter's ``.grad`` has gained the
        gradient of all shares' losses, as if one ``fn`` had run on all the rows: one share
        back-propagates straight into ``.grad``; several each take their gradients with
        ``autograd.grad`` (no two threads write one ``.grad``), summed in share order. Returns the
        shares' results in order."""
        shares = self.shares(rows, lengths, prompt_width)
        if len(shares) == 1:
            return [fn(shares[0])]
        # per share: the gradients of each parameter list it back-propagated into, in call order
        collected: list[dict[tuple[int, ...], tuple]] = [{} for _ in shares]
        param_lists: dict[tuple[int, ...], Sequence[nn.Parameter]] = {}

        def task(i: int, share: Tensor) -> T:
            _inside.grads = (collected[i], param_lists)
            try:
                return fn(share)
            finally:
                _inside.grads = None

        results = self.run([lambda i=i, r=r: task(i, r) for i, r in enumerate(shares)])
        keys = list(dict.fromkeys(k for c in collected for k in c))  # first share's order first
        for key in keys:
            accumulate(param_lists[key], [c.get(key) for c in collected])
        return results

    @staticmethod
    def backward(loss: Tensor, params: Sequence[nn.Parameter]) -> None:
        """Back-propagate ``loss`` into the gradients of ``params``: ``loss.backward()``; inside a share
        of :meth:`accumulate` that runs beside others, into that share's own gradients (summed into
        ``.grad`` once every share has finished)."""
        if not loss.requires_grad:
            return
        into = getattr(_inside, "grads", None)
        if into is None:
            loss.backward()
            return
        collected, param_lists = into
        key = tuple(map(id, params))
        param_lists.setdefault(key, params)
        collected[key] = torch.autograd.grad(loss, params, allow_unused=True)

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


def accumulate(params: Sequence[nn.Parameter], per_lane: list[tuple | None]) -> None:
    """Add the lanes' gradients into ``.grad``, summed in lane order (deterministic). The sum is a
    new tensor (a lone share's gradient is copied): autograd may hand the same tensor, or a
    broadcast view, to several parameters, and ``.grad`` is accumulated into in place later."""
    for i, p in enumerate(params):
        parts = [grads[i] for grads in per_lane if grads is not None and grads[i] is not None]
        if not parts:
            continue
        total = parts[0] + parts[1] if len(parts) > 1 else parts[0].clone(memory_format=torch.contiguous_format)
        for g in parts[2:]:
            total += g
        p.grad = total if p.grad is None else p.grad.add_(total)


def resolve_lanes(requested: int, device: torch.device, distributed: bool) -> int:
    """How many lanes to use: ``requested`` on CPU in a single process, else 1 (see module doc)."""
    if device.type != "cpu" or distributed:
        return 1
    return max(1, min(requested, torch.get_num_threads()))


# Every lane but the first back-propagates into gradient tensors of its own — one more copy of all
# trained parameters' gradients, allocated, written and summed into ``.grad`` per micro-batch — and
# keeps its own malloc arena, whose free memory the other threads do not reuse. What a lane gains is
# filling the gaps between ops, which does not grow with the model; what it costs does: the tiny W1
# models gain from two lanes, the 135 M model of W3 loses time and memory with them (docs/benchmarks.md,
# memory section). Above this many bytes of trained gradients a run keeps one lane (LoRA trains only
# its adapters, so it keeps the lanes).
MAX_LANE_GRADIENT_BYTES = 256 * 2**20


def gradient_bytes(*models: nn.Module | None) -> int:
    """Bytes of the gradients of the models' trainable parameters (each parameter once)."""
    params = {id(p): p for m in models if m is not None for p in m.parameters() if p.requires_grad}
    return sum(p.numel() * p.element_size() for p in params.values())


AUTO_LANES = 2
"""Lanes of ``model.cpu_lanes`` 0 (auto) below :data:`MAX_LANE_GRADIENT_BYTES`."""


def lanes_for(requested: int, device: torch.device, distributed: bool, *models: nn.Module | None,
              hidden: int = 0, checkpointed: bool = False) -> Lanes:
    """The lanes of a run: :func:`resolve_lanes` of ``requested`` (``model.cpu_lanes``), and one lane
    when a trained model uses gradient checkpointing (``checkpointed``: reentrant checkpointing does
    not support the ``autograd.grad`` lanes use). ``requested`` 0 = auto: :data:`AUTO_LANES`, or one
    lane when the trained models' gradients exceed :data:`MAX_LANE_GRADIENT_BYTES` (an extra lane's
    gradient copy and arena then cost more than its gain)."""
    if requested == 0:
        requested = 1 if gradient_bytes(*models) > MAX_LANE_GRADIENT_BYTES else AUTO_LANES
    if checkpointed:
        return Lanes(1, hidden=hidden)
    return Lanes(resolve_lanes(requested, device, distributed), hidden=hidden)
