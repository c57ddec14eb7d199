"""A source that samples ahead of the learner (``rollout.max_staleness`` k ≥ 1; docs/async.md).

A producer thread samples iteration j with its own copy of the policy's weights at version
s(j) = max(0, j − 1 − k) — the learner's weights after iteration j − 1 − k — while the learner trains
on the iterations before j. The schedule is exact, not "the newest weights at the time": the producer
waits for version s(j) to be published before it samples j, and a publish of version v waits until
the producer has finished every iteration that samples with v − 1 (those up to v + k). So at most k
batches wait for the learner, the producer paces itself (it never drops a batch), an episode never
spans a publish, and a seeded run samples the same trajectories however the two threads are timed:
each iteration's sampling generator is seeded by the iteration (``seed_for``), and a checkpoint
keeps the batches already sampled (:meth:`AsyncSource.pending`), so a run resumed after a crash takes
exactly what the uninterrupted one would have. The producer stops at the run's last iteration: a
finished run continued to more iterations samples its first k new ones with its last weights.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import torch
from torch import nn

from ..runtime.errors import UserError
from .producer import Producer
from .sampling import SamplingParams
from .source import Request
from .trajectory import TrajectoryBatch


class ProducerError(RuntimeError):
    """The producer thread stopped on an error; the learner raises it where it takes a batch."""


class AsyncSource:
    """``producer`` samples with ``weights`` (a copy of the learner's language model ``learner_lm``,
    the one the producer's engine decodes with); ``plan(j)`` says what iteration j plays;
    ``seed_for(j)`` seeds its sampling generator (on ``device``); ``last``: the run's last iteration."""

    def __init__(self, producer: Producer, plan: Callable[[int], Request], *, samples: int, sampling: SamplingParams,
                 max_staleness: int, seed_for: Callable[[int], int], weights: nn.Module, learner_lm: nn.Module,
                 last: int, device: torch.device | str = "cpu"):
        if max_staleness < 1:
            raise ValueError("an asynchronous source needs max_staleness ≥ 1 (0 is the synchronous source)")
        self.producer, self.plan, self.samples, self.sampling = producer, plan, samples, sampling
        self.k, self.seed_for, self.weights, self.learner_lm = max_staleness, seed_for, weights, learner_lm
        self.last, self.device = last, device
        self._floor = 0  # the version it started with: no iteration samples with older weights
        self._cv = threading.Condition()
        self._thread: threading.Thread | None = None
        self._ready: dict[int, TrajectoryBatch] = {}
        self._published = 0  # the version the copy holds
        self._done_through = 0  # the last iteration sampled
        self._error: BaseException | None = None
        self._stop = False
        self.waited = {"learner_wait_s": 0.0, "producer_wait_s": 0.0}

    # -- the learner's side -------------------------------------------------------------------
    def start(self, at: int, pending: list[TrajectoryBatch] = ()) -> None:
        """Begin after iteration ``at`` (0: a new run; a resumed one: its checkpoint's), the copy holding
        the learner's weights of version ``at``, with the batches a checkpoint kept (``pending``)."""
        if self._thread is not None:
            return
        self._copy_weights()
        self._published = self._floor = at
        self.producer.engine.update_weights(at)
        self._ready = {b.iteration: b for b in pending}
        self._done_through = max([at, *self._ready])
        self._thread = threading.Thread(target=self._run, name="ppo-lm producer", daemon=True)
        self._thread.start()

    def take(self, iteration: int) -> TrajectoryBatch:
        if self._thread is None:
            self.start(iteration - 1)
        with self._cv:
            waited = _wait(self._cv, lambda: iteration in self._ready or self._error is not None)
            self.waited["learner_wait_s"] += waited
            self._raise()
            return self._ready.pop(iteration)

    def publish(self, version: int) -> None:
        """The learner's weights after iteration ``version``: copied once the producer is done with every
        iteration that samples with ``version − 1``."""
        if self._thread is None:
            return
        with self._cv:
            waited = _wait(self._cv, lambda: self._done_through >= min(version + self.k, self.last)
                           or self._error is not None)
            self.waited["learner_wait_s"] += waited
            self._raise()
            self._copy_weights()
            self._published = version
            self.producer.engine.update_weights(version)
            self._cv.notify_all()

    def pending(self) -> list[TrajectoryBatch]:
        """The batches sampled and not yet taken, in order (what a checkpoint keeps)."""
        with self._cv:
            return [self._ready[j] for j in sorted(self._ready)]

    def close(self) -> None:
        with self._cv:
            self._stop = True
            self._cv.notify_all()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self.producer.envs is not None:
            self.producer.envs.close()

    # -- the producer's side ------------------------------------------------------------------
    def _run(self) -> None:
        try:
            j = self._done_through + 1
            while j <= self.last:
                need = max(self._floor, j - 1 - self.k)
                with self._cv:
                    waited = _wait(self._cv, lambda need=need: self._published == need or self._stop)
                    self.waited["producer_wait_s"] += waited
                    if self._stop:
                        return
                request = self.plan(j)
                generator = torch.Generator(device=self.device).manual_seed(self.seed_for(j))
                trajectories = self.producer.produce(request.rows, samples=self.samples, sampling=self.sampling,
                                                     generator=generator, seeds=request.seeds)
                with self._cv:
                    self._ready[j] = TrajectoryBatch(trajectories, self.samples, self.producer.environment, j)
                    self._done_through = j
                    self._cv.notify_all()
                j += 1
        except BaseException as e:  # noqa: BLE001 (handed to the learner, which raises it)
            with self._cv:
                self._error = e
                self._cv.notify_all()

    def _copy_weights(self) -> None:
        with torch.no_grad():
            for dst, src in zip(self.weights.state_dict().values(), self.learner_lm.state_dict().values()):
                dst.copy_(src)

    def _raise(self) -> None:
        if self._error is None:
            return
        e = self._error
        if isinstance(e, UserError):  # a user's environment or tool: its own one-line error
            raise e
        raise ProducerError(f"the producer stopped: {type(e).__name__}: {e}") from e


def _wait(cv: threading.Condition, ready: Callable[[], bool]) -> float:
    """Wait on ``cv`` (held) until ``ready()``; returns the seconds waited."""
    t0 = time.perf_counter()
    while not ready():
        cv.wait(timeout=1.0)
    return time.perf_counter() - t0
