"""The process an asynchronous producer samples in (docs/async.md): started by
:class:`~ppo_lm.rollout.sources.async_source.AsyncSource` through :mod:`ppo_lm.runtime.child`, told what to
sample over its socket (a pickled :class:`ProducerSpec`: its own copy of the policy's language model, its engine, the
plan of the iterations, with an environment the settings of its own pool of workers), and then on its
own: iteration after iteration it copies the weights the iteration needs out of the shared
:class:`~ppo_lm.rollout.sources.weight_box.WeightBox` — waiting for the learner to publish them — samples
the iteration's trajectories and sends them. It ends when the learner closes the source or dies
(even by SIGKILL), taking its environment's workers with it.

Messages it sends: ``("ready",)``, ``("took", version)``, ``("batch", TrajectoryBatch, timing)`` — the
seconds it waited for the weights (``producer_idle_s``), sampled (``producer_decode_s``: decoding and
the environments), ``("done",)`` after the last iteration, ``("error", exception or
(type name, message, traceback))``. It receives ``("weights", version)`` once the learner has
written that version into the box.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection

import torch

from ...runtime.errors import UserError
from ..sample.producer import Producer
from ..sample.sampling import SamplingParams
from ..trajectory import TrajectoryBatch
from .source import Request
from .staleness import Staleness
from .weight_box import BoxLayout, WeightBox


class ProducerWaitedTooLong(UserError):
    """The learner sent no weights for ``rollout.stall_timeout_s``."""


@dataclass
class ProducerSpec:
    """What the producer's process samples: iterations ``first`` … ``lag.last`` of ``plan``, iteration j
    with the weights of version ``lag.version_for(j)``, its generator seeded by ``seed_for(j)`` on
    ``device``; ``threads``: torch's CPU threads there."""

    producer: Producer
    plan: Callable[[int], Request]
    samples: int
    sampling: SamplingParams
    lag: Staleness
    first: int
    seed_for: Callable[[int], int]
    device: str
    threads: int
    box_fd: int
    layout: BoxLayout
    stall_timeout_s: float = 1800.0


def run(spec: ProducerSpec, conn: Connection) -> None:
    """Sample every iteration of ``spec`` in order and send each batch; the learner paces the weights."""
    if spec.threads:
        torch.set_num_threads(spec.threads)
    box = WeightBox.attach(spec.box_fd, spec.layout)
    box.close_fd()  # mapped: the descriptor is not needed
    producer = spec.producer
    lm = producer.engine.lm.eval().requires_grad_(False)
    params = dict(lm.named_parameters())
    targets = [params[n] for n in spec.layout.names]
    conn.send(("ready",))
    in_box, held = spec.lag.floor, None  # the version the learner last wrote; the one the model holds
    for j in range(spec.first, spec.lag.last + 1):
        need = spec.lag.version_for(j)
        t0 = time.perf_counter()
        if held != need:
            while in_box < need:
                if not conn.poll(spec.stall_timeout_s):
                    raise ProducerWaitedTooLong(
                        f"the producer waited {spec.stall_timeout_s:g} s for the learner's weights of version {need} "
                        "with no word from the learner; its checkpoints so far are intact: continue with `--resume`, "
                        "or give it more time with `--rollout.stall-timeout-s`")
                kind, in_box = conn.recv()
            box.read_into(targets)
            held = need
            producer.engine.update_weights(need)
            conn.send(("took", need))
        waited = time.perf_counter() - t0
        t1 = time.perf_counter()
        request = spec.plan(j)
        generator = torch.Generator(device=spec.device).manual_seed(spec.seed_for(j))
        trajectories = producer.produce(request.rows, samples=spec.samples, sampling=spec.sampling,
                                        generator=generator, seeds=request.seeds)
        timing = {"producer_idle_s": waited, "producer_decode_s": time.perf_counter() - t1}
        conn.send(("batch", TrajectoryBatch(trajectories, spec.samples, producer.environment, j), timing))
    conn.send(("done",))


def _report(conn: Connection, e: BaseException) -> None:
    """The error to the learner: a user's error as itself (its one line), anything else by name,
    message and traceback."""
    payload: object = (type(e).__name__, str(e), traceback.format_exc())
    if isinstance(e, UserError):
        if isinstance(e, ProducerWaitedTooLong):  # seen even where the learner is stuck
            print(f"ppo-lm producer: {e}", file=sys.stderr, flush=True)
        with contextlib.suppress(Exception):
            pickle.loads(pickle.dumps(e))
            payload = e
    with contextlib.suppress(OSError):
        conn.send(("error", payload))


def child_main(conn: Connection, groups: int) -> None:
    """The producer (started by :func:`ppo_lm.runtime.child.start`, whose watchdog ends it — and so its
    environment's workers, whose pipes it holds — when the learner closes the source or dies)."""
    os.close(groups)  # no process groups of its own to report: its workers' watchdogs kill theirs
    paths, blob = conn.recv()
    sys.path[:0] = [p for p in paths if p not in sys.path]
    try:
        run(pickle.loads(blob), conn)
    except BaseException as e:  # noqa: BLE001 (handed to the learner, which raises it)
        _report(conn, e)
    with contextlib.suppress(EOFError, OSError):
        while True:  # the learner ends this process (its watchdog)
            conn.recv()
