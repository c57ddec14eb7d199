"""The RL math of ppo-lm as pure tensor functions; nothing here knows about models.

Per-token tensors are (B, T) over response positions, ``mask`` is right-padded (GAE's and
returns-to-go's scans) or any 0/1 mask (masked sums; ``compute_advantages`` compacts holes for the
scans), ``values[:, t]`` is V_old(x_t). See docs/algorithm.md §1 and §3 and each function's docstring for shapes and references.
"""

from ._checks import assume_valid_masks, check_positive, check_response_mask, check_unit_interval
from .advantages import (
    Compaction,
    adaptive_lambda,
    broadcast_to_tokens,
    compact_tokens,
    gae,
    grpo_advantages,
    has_holes,
    masked_mean_var,
    reinforce_pp_advantages,
    rloo_advantages,
    whiten,
)
from .kl import (
    KL_ESTIMATORS,
    AdaptiveKLController,
    FixedKLController,
    episode_returns,
    kl_loss_per_token,
    kl_penalty,
    shape_rewards,
)
from .losses import (
    AGG_MODES,
    aggregate,
    entropy_from_logits,
    explained_variance,
    loss_units,
    pg_loss,
    policy_loss,
    value_loss,
)
from .objective import ObjectiveSettings, ppo_objective
from .registry import (
    ADVANTAGE_ESTIMATORS,
    POLICY_LOSSES,
    AdvantageInputs,
    AdvantageSettings,
    EstimatorName,
    EstimatorSpec,
    compute_advantages,
    get_advantage_estimator,
    get_policy_loss,
)
from .stats import StatsAggregator, UpdateStats

__all__ = [
    "episode_returns",
    "ADVANTAGE_ESTIMATORS",
    "AGG_MODES",
    "KL_ESTIMATORS",
    "POLICY_LOSSES",
    "AdaptiveKLController",
    "AdvantageInputs",
    "AdvantageSettings",
    "Compaction",
    "EstimatorName",
    "EstimatorSpec",
    "FixedKLController",
    "ObjectiveSettings",
    "StatsAggregator",
    "UpdateStats",
    "adaptive_lambda",
    "aggregate",
    "assume_valid_masks",
    "check_positive",
    "check_response_mask",
    "check_unit_interval",
    "broadcast_to_tokens",
    "compact_tokens",
    "compute_advantages",
    "entropy_from_logits",
    "explained_variance",
    "gae",
    "get_advantage_estimator",
    "get_policy_loss",
    "grpo_advantages",
    "has_holes",
    "kl_loss_per_token",
    "kl_penalty",
    "loss_units",
    "masked_mean_var",
    "pg_loss",
    "policy_loss",
    "ppo_objective",
    "reinforce_pp_advantages",
    "rloo_advantages",
    "shape_rewards",
    "value_loss",
    "whiten",
]
