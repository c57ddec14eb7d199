"""Where the learner takes each iteration's trajectories from (docs/architecture.md, "Producer,
trajectories, source").

A source turns an iteration number into a :class:`~ppo_lm.rollout.trajectory.TrajectoryBatch`: which
rows and seeds an iteration plays is the plan's (the trainer's schedule), how and when they are
sampled is the source's. :class:`SyncSource` samples on demand, with the weights the learner holds
when it asks: every trajectory of iteration k is sampled by version k − 1, on policy.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch

from ..sample.producer import Producer
from ..sample.sampling import SamplingParams
from ..trajectory import TrajectoryBatch


@dataclass(frozen=True)
class Request:
    """What an iteration plays: this rank's prompt rows and, with an environment, one seed per row."""

    rows: list[dict]
    seeds: list[int] | None = None


class TrajectorySource(Protocol):
    producer_threads: int
    """Torch threads of a producer sampling in a process of its own; 0 where the learner samples."""

    def take(self, iteration: int) -> TrajectoryBatch:
        """The trajectories the learner trains on in ``iteration`` (1-based)."""
        ...

    def start(self, at: int, pending: list[TrajectoryBatch] = ()) -> None:
        """Begin after iteration ``at``, with the batches a checkpoint kept."""
        ...

    def publish(self, version: int) -> None:
        """The learner's weights after iteration ``version``: the engine that samples in the learner's
        process takes them, and a producer elsewhere is handed them."""
        ...

    def metrics(self, iteration: int) -> dict[str, float]:
        """What the source reports of ``iteration``'s batch besides its trajectories (an asynchronous
        producer's own clock and the waits on either side; docs/async.md); {} where the learner samples."""
        ...

    def pending(self) -> list[TrajectoryBatch]:
        """The batches sampled and not yet taken (what a checkpoint keeps)."""
        ...

    def close(self) -> None:
        """Stop whatever it runs (worker processes, threads); it starts them again if taken from."""
        ...


class SyncSource:
    """Samples iteration k's requests (``plan(k)``) when the learner takes them: ``samples`` per row
    under ``sampling``, with ``generator`` (the run's sampling stream, saved in its checkpoints)."""

    producer_threads = 0  # the learner samples, with its own threads

    def __init__(self, producer: Producer, plan: Callable[[int], Request], *, samples: int,
                 sampling: SamplingParams, generator: torch.Generator | None):
        self.producer, self.plan = producer, plan
        self.samples, self.sampling, self.generator = samples, sampling, generator

    def take(self, iteration: int) -> TrajectoryBatch:
        request = self.plan(iteration)
        trajectories = self.producer.produce(request.rows, samples=self.samples, sampling=self.sampling,
                                             generator=self.generator, seeds=request.seeds)
        return TrajectoryBatch(trajectories, self.samples, self.producer.environment, iteration)

    def start(self, at: int, pending: list[TrajectoryBatch] = ()) -> None:
        if pending:
            raise ValueError("a synchronous source keeps no batches between iterations")

    def publish(self, version: int) -> None:
        self.producer.engine.update_weights(version)

    def metrics(self, iteration: int) -> dict[str, float]:
        return {}  # the learner samples: its own `generate_s` is the producer's time

    def pending(self) -> list[TrajectoryBatch]:
        return []

    def close(self) -> None:
        if self.producer.envs is not None:
            self.producer.envs.close()
        if self.producer.agents is not None:
            self.producer.agents.close()
