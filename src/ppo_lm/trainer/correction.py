"""Step 3b of the loop: the off-policy correction's weights on the policy loss (docs/algorithm.md §1.6),
for a rollout whose sampler (π_behav) is not exactly the policy the update clips against (π_prox)."""

from __future__ import annotations

import torch
from torch import Tensor

from ..algorithms.off_policy import CorrectionSettings, off_policy_weights, resolve_correction
from ..config.train import AlgoConfig
from ..rollout.score.batch import RolloutBatch
from ..runtime import distributed as dist


def off_policy_correction(batch: RolloutBatch, mask: Tensor, a: AlgoConfig, *, iteration: int, lagged: bool
                          ) -> tuple[Tensor | None, dict[str, float]]:
    """``algo.off_policy_correction``'s weights (B, T) on the policy loss (None for none) — its mask part
    replaced by ``algo.off_policy_mask`` where set, with ``algo.is_veto`` — and its statistics over the
    whole batch: sums over every rank's tokens, so a rank with more tokens counts for more. 'none' chosen
    explicitly logs the statistics of weights it leaves at 1 (what the staleness did). With ``lagged`` (an
    asynchronous run) the statistics also say how stale the batch was (:func:`staleness_metrics`)."""
    lag = staleness_metrics(batch, mask, iteration) if lagged and batch.versions is not None else {}
    if a.off_policy_correction is None:
        return None, lag
    if batch.logp_behaviour is None:
        raise ValueError("an off-policy correction needs the sampler's log-probabilities (`logp_behaviour`)")
    none = a.off_policy_correction == "none"
    parts = resolve_correction(a.off_policy_correction, None if none else a.off_policy_mask)
    settings = CorrectionSettings(a.is_cap, a.is_band_low, a.is_band_high, None if none else a.is_veto)
    weights, sums = off_policy_weights(batch.logp_old, batch.logp_behaviour, mask, parts, settings)
    stats = sums.reduced(dist.all_reduce_sum, dist.all_reduce_max).metrics()
    return (None if none else weights), {**stats, **lag}


def staleness_metrics(batch: RolloutBatch, mask: Tensor, iteration: int) -> dict[str, float]:
    """How many updates old the sampling weights of ``iteration``'s batch were (the learner's version
    before this update is iteration − 1): ``staleness_mean`` over the whole batch's sampled tokens (every
    rank's, a token counting once), ``staleness_max`` over its responses."""
    lag = (iteration - 1 - batch.versions).double()  # (B,)
    tokens = mask.sum(1).double()
    total = dist.all_reduce_sum(torch.stack([(lag * tokens).sum(), tokens.sum()]))
    return {"staleness_mean": float(total[0] / total[1].clamp_min(1)),
            "staleness_max": float(dist.all_reduce_max(lag.max() if lag.numel() else lag.new_zeros(())))}
