"""Step 3b of the loop: the off-policy correction's weights on the policy loss (docs/algorithm.md §1.6),
for a rollout whose sampler (π_behav) is not exactly the policy the update clips against (π_prox)."""

from __future__ import annotations

from torch import Tensor

from ..algorithms.off_policy import CorrectionSettings, off_policy_weights
from ..config.train import AlgoConfig
from ..rollout.batch import RolloutBatch
from ..runtime import distributed as dist


def off_policy_correction(batch: RolloutBatch, mask: Tensor, a: AlgoConfig) -> tuple[Tensor | None, dict[str, float]]:
    """``algo.off_policy_correction``'s weights (B, T) on the policy loss (None for none) and its
    statistics, global over ranks (means of the ranks' means; the largest weight of any rank); 'none'
    chosen explicitly logs the statistics of weights it leaves at 1 (what the staleness did)."""
    if a.off_policy_correction is None:
        return None, {}
    if batch.logp_behaviour is None:
        raise ValueError("an off-policy correction needs the sampler's log-probabilities (`logp_behaviour`)")
    weights, stats = off_policy_weights(batch.logp_old, batch.logp_behaviour, mask, a.off_policy_correction,
                                        CorrectionSettings(a.is_cap, a.is_band_low, a.is_band_high))
    world = dist.world_size()
    out = {k: float(dist.all_reduce_sum(v.double())) / world for k, v in stats.items() if k != "is_weight_max"}
    out["is_weight_max"] = float(dist.all_reduce_max(stats["is_weight_max"]))
    return (None if a.off_policy_correction == "none" else weights), out
