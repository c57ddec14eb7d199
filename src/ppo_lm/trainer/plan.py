"""What each iteration plays on this rank — its prompt rows, and with an environment one seed per row —
as the source asks for it (:class:`~ppo_lm.rollout.sources.source.Request`); the arithmetic is
trainer/seeds.py's."""

from __future__ import annotations

from dataclasses import dataclass

from ..rollout.sources.source import Request
from . import seeds


@dataclass(frozen=True)
class Plan:
    """``rows``: every training row; ``per_iteration``: rows an iteration takes over all ranks
    (``rollout.num_prompts``); ``env``: episodes of an environment (which get seeds)."""

    rows: list[dict]
    per_iteration: int
    seed: int
    rank: int
    world: int
    shuffle: bool
    env: bool

    def rows_for(self, iteration: int) -> list[dict]:
        """This rank's prompt rows for ``iteration`` (1-based)."""
        return [self.rows[i] for i in seeds.prompt_indices(
            len(self.rows), iteration, per_iteration=self.per_iteration, rank=self.rank, world=self.world,
            seed=self.seed, shuffle=self.shuffle)]

    def seeds_for(self, iteration: int) -> list[int]:
        """A seed per group (prompt row) of this rank's share of ``iteration``."""
        return seeds.episode_seeds(self.seed, iteration, per_iteration=self.per_iteration, rank=self.rank,
                                      world=self.world)

    def __call__(self, iteration: int) -> Request:
        return Request(self.rows_for(iteration), self.seeds_for(iteration) if self.env else None)
