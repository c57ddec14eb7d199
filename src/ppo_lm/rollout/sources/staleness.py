"""The one rule of asynchronous PPO's lag (docs/async.md), kept in one class as AReaL keeps its
staleness control: which weights each iteration samples with, and so which batches may exist ahead
of the learner. Both sides of :class:`~ppo_lm.rollout.sources.async_source.AsyncSource` — the learner's
waits and publishes, the producer's copies — ask it, never the arithmetic."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Staleness:
    """``k`` (``rollout.max_staleness``, ≥ 1): iteration j samples with the learner's weights after
    iteration s(j) = max(``floor``, j − 1 − k), so it trains at most k updates behind them; ``floor``:
    the version the run (or its resumption) starts from; ``last``: the run's last iteration."""

    k: int
    floor: int
    last: int

    def version_for(self, j: int) -> int:
        """s(j): the version iteration ``j`` samples with."""
        return max(self.floor, j - 1 - self.k)

    def needed(self, version: int) -> bool:
        """Whether some iteration up to ``last`` samples with ``version`` (later ones are written nowhere)."""
        return version <= self.version_for(self.last)

    def ahead(self, published: int) -> range:
        """What a checkpoint taken after publishing ``published`` must hold (the learner waits for them):
        the next k iterations, not past ``last``. Each samples with a version up to ``published``, and so
        does the one after them — where a resumed producer starts, holding the checkpoint's weights."""
        return range(published + 1, min(published + self.k, self.last) + 1)
