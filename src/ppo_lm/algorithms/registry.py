"""Registries so the trainer picks an advantage estimator and a policy loss by name.

Every advantage estimator has one signature (keyword-only, unused inputs ignored) and returns
``(advantages, returns)`` as (B, T) tensors; ``returns`` is None for critic-free estimators.

Loss aggregation by default (``algo.loss_agg: auto`` resolves to :attr:`EstimatorSpec.loss_agg`):
token-mean for ``gae``, ``grpo``, ``rloo`` and ``reinforce++``; seq-mean-token-sum-norm for
``dr_grpo``. That is not each paper's own: Shao et al. (2024) average GRPO's loss over each response's
tokens first, then over responses (seq-mean-token-mean; set ``algo.loss_agg`` to it for the paper's
form). Token-mean weighs every token alike, so a long response's tokens are not down-weighted (the
length bias Liu et al. 2025 find in the per-response mean), and it is one normalisation for all four,
so runs of different estimators differ in their advantages only. Dr. GRPO's seq-mean-token-sum-norm
(a constant horizon in place of each response's length) is one of the two changes that define it,
so it comes with the estimator.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Literal

from torch import Tensor

from .advantages import (
    AllReduce,
    adaptive_lambda,
    broadcast_to_tokens,
    compact_tokens,
    gae,
    grpo_advantages,
    has_holes,
    reinforce_pp_advantages,
    rloo_advantages,
)
from .losses import pg_loss, policy_loss


@dataclass(frozen=True)
class AdvantageInputs:
    """What a rollout offers an estimator. Shapes: B responses, T response positions.

    rewards: (B, T) shaped rewards (score + KL part) or score-only, per the trainer's settings.
    values: (B, T) V_old(x_t), or None without a critic.  mask: (B, T).  scores: (B,).
    terminated: (B,) bool.  bootstrap_values: (B,) or None.  group_size: samples per prompt.
    critic_rewards: (B, T) rewards for the critic target when they differ (score-only target),
    else None (use ``rewards``).
    """

    rewards: Tensor
    mask: Tensor
    scores: Tensor
    terminated: Tensor
    values: Tensor | None = None
    bootstrap_values: Tensor | None = None
    group_size: int = 1
    critic_rewards: Tensor | None = None


@dataclass(frozen=True)
class AdvantageSettings:
    gamma: float = 1.0
    lam: float = 0.95
    critic_lam: float | None = None  # decoupled GAE (VC-PPO): λ for the critic target
    adaptive_lam_alpha: float | None = None  # VAPO: λ_actor = 1 − 1/(α·l)


Estimator = Callable[..., tuple[Tensor, Tensor | None]]


@dataclass(frozen=True)
class EstimatorSpec:
    fn: Estimator
    needs_critic: bool
    needs_groups: bool
    uses_shaped_rewards: bool  # False: built from the scores alone, so a KL in the reward has no effect
    loss_agg: str = "token-mean"
    """The ``algo.loss_agg`` that ``auto`` resolves to: token-mean, whatever the estimator's paper used,
    except where the aggregation is part of the estimator (Dr. GRPO); see the module docstring."""
    advantages_are: str = ""
    """What the estimator's own advantages are, in words (before any whitening by the trainer): the
    credit report labels its ``advantage_raw`` column with it. Empty: nothing more than "its Â"."""
    whitened_by_trainer: bool = False
    """``algo.whiten_advantages`` applies: the trainer whitens its Â over the batch (GAE's, whose scale
    follows the rewards'); the others are normalised by their own definition, or not at all."""
    uses_lambda: bool = False
    """Its Â depends on ``algo.gae_lambda`` (the credit report shows each episode's λ)."""


ADVANTAGE_ESTIMATORS: dict[str, EstimatorSpec] = {}
"""The estimators by name, each registered where it is defined (:func:`estimator`)."""


def estimator(name: str, **properties) -> Callable[[Estimator], Estimator]:
    """Register the decorated function as the advantage estimator ``name`` with the
    :class:`EstimatorSpec` ``properties``."""
    def register(fn: Estimator) -> Estimator:
        if name in ADVANTAGE_ESTIMATORS:
            raise ValueError(f"advantage estimator {name!r} is registered twice")
        ADVANTAGE_ESTIMATORS[name] = EstimatorSpec(fn, **properties)
        return fn

    return register


@estimator("gae", needs_critic=True, needs_groups=False, uses_shaped_rewards=True, whitened_by_trainer=True,
           uses_lambda=True, advantages_are="GAE's Σ_l (γλ)^l·δ_{t+l}")
def _gae_estimator(
    x: AdvantageInputs, s: AdvantageSettings, all_reduce: AllReduce | None
) -> tuple[Tensor, Tensor | None]:
    if x.values is None:
        raise ValueError("the `gae` estimator needs critic values")
    lam_actor: float | Tensor = s.lam
    if s.adaptive_lam_alpha is not None:
        lam_actor = adaptive_lambda(x.mask.sum(1), s.adaptive_lam_alpha).to(x.rewards.dtype)
    kw = dict(gamma=s.gamma, terminated=x.terminated, bootstrap_values=x.bootstrap_values)
    advantages, returns = gae(x.rewards, x.values, x.mask, lam=lam_actor, **kw)
    critic_lam = s.lam if s.critic_lam is None else s.critic_lam
    # isinstance first: comparing a float to a (B,) λ tensor gives a tensor whose truth value is
    # ambiguous (RuntimeError for B > 1).
    if isinstance(lam_actor, Tensor) or x.critic_rewards is not None or critic_lam != lam_actor:
        crit_r = x.rewards if x.critic_rewards is None else x.critic_rewards
        _, returns = gae(crit_r, x.values, x.mask, lam=critic_lam, **kw)
    return advantages, returns


@estimator("grpo", needs_critic=False, needs_groups=True, uses_shaped_rewards=False,
           advantages_are="GRPO's group-normalised score (s − mean)/std over the prompt's samples, on every token")
def _grpo(x: AdvantageInputs, s: AdvantageSettings, all_reduce: AllReduce | None):
    return broadcast_to_tokens(grpo_advantages(x.scores, x.group_size), x.mask), None


@estimator("dr_grpo", needs_critic=False, needs_groups=True, uses_shaped_rewards=False,
           loss_agg="seq-mean-token-sum-norm",
           advantages_are="Dr. GRPO's group-centred score s − mean over the prompt's samples, on every token")
def _dr_grpo(x: AdvantageInputs, s: AdvantageSettings, all_reduce: AllReduce | None):
    adv = grpo_advantages(x.scores, x.group_size, scale_by_std=False)
    return broadcast_to_tokens(adv, x.mask), None


@estimator("rloo", needs_critic=False, needs_groups=True, uses_shaped_rewards=False,
           advantages_are="RLOO's score minus the mean of the prompt's other samples, on every token")
def _rloo(x: AdvantageInputs, s: AdvantageSettings, all_reduce: AllReduce | None):
    return broadcast_to_tokens(rloo_advantages(x.scores, x.group_size), x.mask), None


@estimator("reinforce++", needs_critic=False, needs_groups=False, uses_shaped_rewards=True,
           advantages_are="REINFORCE++'s returns-to-go Σ_k γ^(k−t)·r_k, already whitened over the batch by the "
                          "estimator itself")
def _reinforce_pp(x: AdvantageInputs, s: AdvantageSettings, all_reduce: AllReduce | None):
    return reinforce_pp_advantages(x.rewards, x.mask, gamma=s.gamma, all_reduce=all_reduce), None


EstimatorName = Literal[tuple(ADVANTAGE_ESTIMATORS)]  # type: ignore[valid-type]
"""The registered names, as the config field `algo.estimator` takes them (the registry is the one list)."""

POLICY_LOSSES: dict[str, Callable[..., tuple[Tensor, dict[str, Tensor]]]] = {
    "ppo": policy_loss,
    "pg": pg_loss,
}


def get_advantage_estimator(name: str) -> EstimatorSpec:
    try:
        return ADVANTAGE_ESTIMATORS[name]
    except KeyError:
        raise ValueError(
            f"unknown advantage estimator {name!r}; choose one of {sorted(ADVANTAGE_ESTIMATORS)}"
        ) from None


def get_policy_loss(name: str) -> Callable[..., tuple[Tensor, dict[str, Tensor]]]:
    try:
        return POLICY_LOSSES[name]
    except KeyError:
        raise ValueError(f"unknown policy loss {name!r}; choose one of {sorted(POLICY_LOSSES)}") from None


def compute_advantages(
    name: str,
    inputs: AdvantageInputs,
    settings: AdvantageSettings = AdvantageSettings(),
    *,
    all_reduce: AllReduce | None = None,
) -> tuple[Tensor, Tensor | None]:
    """Run the estimator ``name`` → ``(advantages (B, T), returns (B, T) or None)``.

    A mask with holes (multi-turn episodes: observation tokens between the turns, docs/algorithm.md §1.3)
    is compacted first, so every estimator scans the action tokens alone, in order; the outputs are put
    back in place, 0 on the holes. A right-padded mask runs the estimator as it is."""
    spec = get_advantage_estimator(name)
    if not has_holes(inputs.mask):
        return spec.fn(inputs, settings, all_reduce)
    c = compact_tokens(inputs.mask)

    def gather(x: Tensor | None) -> Tensor | None:
        return None if x is None else c.gather(x)

    compact = replace(inputs, rewards=c.gather(inputs.rewards), mask=c.mask, values=gather(inputs.values),
                      critic_rewards=gather(inputs.critic_rewards))
    advantages, returns = spec.fn(compact, settings, all_reduce)
    return c.scatter(advantages), None if returns is None else c.scatter(returns)
