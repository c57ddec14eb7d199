"""A source that samples ahead of the learner (``rollout.max_staleness`` k ≥ 1; docs/async.md).

A producer in a process of its own (:mod:`ppo_lm.rollout.sources.producer_process`), with its own copy of the
policy's language model, samples iteration j with the weights of version s(j) = max(0, j − 1 − k) —
the learner's after iteration j − 1 − k — while the learner trains on the iterations before j. The
schedule is exact, not "the newest weights at the time": the producer waits for version s(j) before
it samples j, so at most k batches wait for the learner, the producer paces itself (it never drops a
batch), an episode never spans a publish, and a seeded run samples the same trajectories however the
two processes are timed — each iteration's sampling generator is seeded by the iteration
(``seed_for``). The weights go through a :class:`~ppo_lm.rollout.sources.weight_box.WeightBox` (the trainable
parameters only: LoRA's adapters alone); a publish writes the box once the producer has copied the
previous version out of it. A checkpoint keeps the batches already sampled (:meth:`AsyncSource.pending`),
so a run resumed after a crash takes exactly what the uninterrupted one would have. The producer stops
at the run's last iteration: a finished run continued to more iterations samples its first k new ones
with its last weights.
"""

from __future__ import annotations

import pickle
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable

import torch
from torch import nn

from ...runtime import child
from ...runtime.errors import UserError
from ..sample.engine import GenerationEngine
from ..sample.producer import Producer
from ..sample.sampling import SamplingParams
from ..trajectory import TrajectoryBatch
from .producer_process import ProducerSpec
from .source import Request
from .staleness import Staleness
from .weight_box import WeightBox


class ProducerError(RuntimeError):
    """The producer's process stopped on an error or ended; the learner raises it where it waits on it."""


class ProducerDied(UserError):
    """The producer's process ended from outside (a signal: killed, out of memory) or exited early."""


class ProducerStalled(UserError):
    """A wait on the other side made no progress for ``rollout.stall_timeout_s``."""


class _RemoteTraceback(Exception):
    """The producer's own traceback, shown as the cause of the :class:`ProducerError`."""


class AsyncSource:
    """``producer`` samples with its own copy of ``learner_lm`` (the learner's language model, whose
    trainable parameters each publish hands over); ``plan(j)`` says what iteration j plays; ``seed_for(j)``
    seeds its sampling generator (on ``device``); ``last``: the run's last iteration; ``threads``: torch's
    CPU threads in the producer's process (0: torch's default); ``stall_timeout_s``: how long either side
    waits on the other with no word from it before the run ends (:class:`ProducerStalled`), naming
    ``checkpoints`` (where the run's checkpoints are) in its line; ``box_dir``: the folder of a file-backed
    weight box (None: anonymous memory); ``learner_engine``: the engine that samples in the learner's
    process (held-out evaluation), which each publish updates too."""

    def __init__(self, producer: Producer, plan: Callable[[int], Request], *, samples: int, sampling: SamplingParams,
                 max_staleness: int, seed_for: Callable[[int], int], learner_lm: nn.Module,
                 learner_engine: GenerationEngine, last: int, device: torch.device | str = "cpu", threads: int = 0, stall_timeout_s: float = 1800.0,
                 checkpoints: str = "the output folder", box_dir: str | None = None):
        if max_staleness < 1:
            raise ValueError("an asynchronous source needs max_staleness ≥ 1 (0 is the synchronous source)")
        self.producer, self.plan, self.samples, self.sampling = producer, plan, samples, sampling
        self.k, self.seed_for, self.learner_lm, self.learner_engine = max_staleness, seed_for, learner_lm, learner_engine
        self.last, self.device, self.producer_threads = last, str(device), threads
        self.stall_timeout_s, self.checkpoints, self.box_dir = stall_timeout_s, checkpoints, box_dir
        self._cv = threading.Condition()
        self._proc: subprocess.Popen | None = None
        self._waited = {"learner_wait_s": 0.0, "producer_wait_s": 0.0}

    # -- the learner's side -------------------------------------------------------------------
    def start(self, at: int, pending: list[TrajectoryBatch] = ()) -> None:
        """Begin after iteration ``at`` (0: a new run; a resumed one: its checkpoint's), the producer
        holding the learner's weights of version ``at``, with the batches a checkpoint kept (``pending``)."""
        if self._proc is not None:
            return
        self._ready = {b.iteration: b for b in pending}
        self._timing: dict[int, dict[str, float]] = {}
        self._published = at
        self._took, self._error, self._finished = at - 1, None, False
        first = max([at, *self._ready]) + 1
        # the first version the producer copies out of the box: a checkpoint holding k + 1 batches ahead
        # (the last sampled with version `at`) starts it at version at + 1, so `at` is never taken
        self.lag = Staleness(self.k, at, self.last)
        self._first_need = self.lag.version_for(first)
        trainable = [(n, p) for n, p in self.learner_lm.named_parameters() if p.requires_grad]
        self._params = [p for _, p in trainable]
        self._box = WeightBox.create(trainable, self.box_dir)  # nameless: nothing to leave behind
        self.layout = self._box.layout
        try:
            spec = ProducerSpec(self.producer, self.plan, self.samples, self.sampling, self.lag, first, self.seed_for,
                                self.device, self.producer_threads, self._box.fd, self._box.layout, self.stall_timeout_s)
            blob = pickle.dumps(spec)
            self._spawn(self._box.fd)
        finally:
            self._box.close_fd()  # the producer inherited its own
        self._conn.send(([p for p in sys.path if p], blob))
        self._wait(lambda: self._started, "the producer's process to start")

    def take(self, iteration: int) -> TrajectoryBatch:
        if self._proc is None:
            self.start(iteration - 1)
        self._wait(lambda: iteration in self._ready, f"the batch of iteration {iteration}")
        with self._cv:
            return self._ready.pop(iteration)

    def metrics(self, iteration: int) -> dict[str, float]:
        """How the producer sampled ``iteration``'s batch, on its own clock — ``producer_decode_s`` (sampling
        and the environments) and ``producer_idle_s`` (waiting for the weights it needed), none for a batch a
        checkpoint kept — and the seconds each side has waited on the other so far (``learner_wait_s``,
        ``producer_wait_s``)."""
        own = self._timing.pop(iteration, {}) if self._proc is not None else {}
        return {**own, **self._waited}

    def publish(self, version: int) -> None:
        """The learner's weights after iteration ``version``, written into the box once the producer has
        copied the previous version out of it; nothing to write where no iteration left samples with it."""
        self.learner_engine.update_weights(version)
        if self._proc is None:
            return
        self._published = version
        if not self.lag.needed(version):
            return
        if version - 1 >= self._first_need:  # the producer copies version − 1 out before it is overwritten
            self._wait(lambda: self._took >= version - 1, f"the producer to copy the weights of version {version - 1}")
        self._box.write(self._params)
        try:
            self._conn.send(("weights", version))
        except OSError:  # the producer is gone: the receiver says how
            self._wait(lambda: False, "the producer's process, which is gone")

    def pending(self) -> list[TrajectoryBatch]:
        """The batches sampled ahead and not yet taken, in order — every one sampled with weights older
        than the last published (waited for: what a checkpoint must keep to resume exactly)."""
        if self._proc is None:
            return []
        ahead = self.lag.ahead(self._published)
        what = (f"the batch of iteration {ahead.start}" if len(ahead) == 1
                else f"the batches of iterations {ahead.start}–{ahead.stop - 1}")
        self._wait(lambda: all(j in self._ready for j in ahead), what)
        with self._cv:
            return [self._ready[j] for j in sorted(self._ready)]

    def close(self) -> None:
        """End the producer's process (its environment's workers go with it); started again if taken from."""
        if self._proc is None:
            return
        child.stop([self._child], grace_s=10.0)  # its watchdog ends it at once
        self._receiver.join()  # it saw the socket's end
        self._conn.close()
        self._proc = None

    # -- the producer's process ---------------------------------------------------------------
    def _spawn(self, box_fd: int) -> None:
        self._started, self._heard = False, 0
        self._child = child.start("ppo_lm.rollout.sources.producer_process", pass_fds=(box_fd,))
        self._proc, self._conn = self._child.proc, self._child.conn
        self._receiver = threading.Thread(target=self._receive, name="ppo-lm producer receiver", daemon=True)
        self._receiver.start()

    def _receive(self) -> None:
        """What the producer sends, as it comes (so its sends never wait on the learner)."""
        try:
            while True:
                message = self._conn.recv()
                with self._cv:
                    self._heard += 1
                    self._note(message)
                    self._cv.notify_all()
        except (EOFError, OSError):
            pass
        code = self._proc.wait()
        with self._cv:
            if self._error is None and not self._finished:
                how = f"signal {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"
                self._error = ProducerDied(f"the producer's process ended ({how}) before the run's last iteration — "
                                           f"killed, or out of memory; the checkpoints so far are intact in "
                                           f"{self.checkpoints}: continue with `--resume`")
            self._finished = True
            self._cv.notify_all()

    def _note(self, message: tuple) -> None:
        kind = message[0]
        if kind == "ready":
            self._started = True
        elif kind == "took":
            self._took = message[1]
        elif kind == "batch":
            self._ready[message[1].iteration] = message[1]
            self._timing[message[1].iteration] = message[2]
            self._waited["producer_wait_s"] += message[2]["producer_idle_s"]
        elif kind == "done":
            self._finished = True
        elif kind == "error":
            self._error = _rebuilt(message[1])

    def _wait(self, ready: Callable[[], bool], what: str) -> None:
        """Wait (as the learner; counted in ``learner_wait_s``) until ``ready()``, raising the producer's
        error — or :class:`ProducerStalled` once ``stall_timeout_s`` pass with no message from it."""
        t0 = time.perf_counter()
        with self._cv:
            heard = self._heard
            since = time.monotonic()
            while not ready():
                if self._error is not None:
                    raise self._error
                if self._finished:
                    raise ProducerError("the producer ended without what the learner waits for")
                if self._heard != heard:
                    heard, since = self._heard, time.monotonic()
                elif time.monotonic() - since > self.stall_timeout_s:
                    raise ProducerStalled(
                        f"the learner waited {self.stall_timeout_s:g} s for {what} with no word from the producer "
                        f"(pid {self._proc.pid}); the checkpoints so far are in {self.checkpoints}: continue with "
                        "`--resume`, or give a slow environment more time with `--rollout.stall-timeout-s`")
                self._cv.wait(timeout=min(1.0, self.stall_timeout_s))
        self._waited["learner_wait_s"] += time.perf_counter() - t0

def _rebuilt(payload) -> BaseException:
    if isinstance(payload, UserError):  # a user's environment or tool: its own one-line error
        return payload
    name, message, tb = payload
    error = ProducerError(f"the producer stopped: {name}: {message}")
    error.__cause__ = _RemoteTraceback(tb)
    return error
