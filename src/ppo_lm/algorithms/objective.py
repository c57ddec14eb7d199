"""The PPO objective of one update step as a pure function of tensors (docs/algorithm.md §1.4).

    L = L_policy + β·L_KL − c₂·H[π_θ] + c₁·L_value

Each term is present when its inputs are: the policy terms with ``logp``, the value term with
``values`` — so the same function gives a policy's loss (with a shared critic's value term), a
separate critic's loss (``values`` only), or a critic warm-up step. Nothing here knows about models.

References: Schulman et al. 2017 (PPO); Schulman 2020 (KL estimators); Ouyang et al. 2022 (KL
and entropy terms in RLHF).
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from .kl import kl_loss_per_token
from .losses import aggregate, loss_units, value_loss
from .registry import get_policy_loss
from .stats import UpdateStats

SUM = 1.0
"""The ``denominator`` that leaves an aggregate as its sum over loss units."""


@dataclass(frozen=True)
class ObjectiveSettings:
    """Coefficients and options of :func:`ppo_objective`, named as in the trainer's ``algo`` config."""

    policy_loss: str = "ppo"  # a name of :data:`~.registry.POLICY_LOSSES`
    clip_eps: float = 0.2
    clip_eps_high: float | None = None
    dual_clip: float | None = None
    kl_coef: float = 0.0  # β of the KL loss term; 0 when the KL is in the reward or absent
    kl_estimator: str = "k3"
    kl_clamp: float | None = 10.0
    entropy_coef: float = 0.0  # c₂
    vf_coef: float = 0.1  # c₁
    value_clip_eps: float | None = None
    loss_agg: str = "token-mean"
    horizon: float | None = None  # seq-mean-token-sum-norm's constant (the response limit)


def ppo_objective(
    mask: Tensor,
    settings: ObjectiveSettings,
    *,
    logp: Tensor | None = None,
    logp_old: Tensor | None = None,
    advantages: Tensor | None = None,
    logp_ref: Tensor | None = None,
    entropy: Tensor | None = None,
    values: Tensor | None = None,
    values_old: Tensor | None = None,
    returns: Tensor | None = None,
    weights: Tensor | None = None,
) -> tuple[Tensor, UpdateStats]:
    """The loss of some rows of a minibatch, summed over their loss units, and its statistics.

    Terms: the clipped surrogate (``logp``, ``logp_old``, ``advantages``); β·KL(π_θ ‖ π_ref) when
    ``settings.kl_coef`` > 0 (needs ``logp_ref``; per-token estimate clamped to ±``kl_clamp``); the
    entropy bonus −c₂·H when ``settings.entropy_coef`` > 0 (``entropy`` is only a statistic
    otherwise); c₁ times the (clipped) value loss when ``values`` is given (with ``values_old``,
    ``returns``). Each term is aggregated by ``settings.loss_agg`` as a *sum* over its units (tokens
    for ``token-mean``, responses for the seq-mean modes; :func:`~.losses.loss_units`): the caller
    divides by the units of the batch the mean is over — these rows' own count for their mean, or
    the whole minibatch's over micro-batches, CPU lanes and ranks, so that the summed gradients of
    several calls are the minibatch's (trainer/update.py).

    Args:
        mask: (B, T) valid response tokens.
        logp, entropy, values: (B, T) differentiable outputs of π_θ / V_φ at the response tokens.
        logp_old, advantages, logp_ref, values_old, returns: (B, T) data (no gradient).
        weights: (B, T) an off-policy correction's weights on the surrogate's tokens (:mod:`.off_policy`),
            or None.
    Returns:
        ``(loss, stats)``: a 0-dim loss summed over this call's loss units, and
        :class:`~.stats.UpdateStats` whose values are this call's means (losses per unit,
        diagnostics per token).
    """
    s = settings
    total = dict(denominator=SUM, horizon=s.horizon)
    units = max(loss_units(mask, s.loss_agg), 1.0)
    loss = mask.new_zeros((), dtype=(logp if logp is not None else values).dtype)
    stats = UpdateStats()
    if logp is not None:
        pl, ps = get_policy_loss(s.policy_loss)(
            logp, logp_old, advantages, mask, clip_eps=s.clip_eps, clip_eps_high=s.clip_eps_high,
            dual_clip=s.dual_clip, agg=s.loss_agg, weights=weights, **total)
        loss = loss + pl
        stats.policy_loss = pl.detach() / units
        stats.approx_kl, stats.approx_kl_k3 = ps["approx_kl"], ps["approx_kl_k3"]
        stats.policy_clip_frac, stats.dual_clip_frac = ps["clip_frac"], ps["dual_clip_frac"]
        stats.ratio_max = ps["ratio_max"]
        if s.kl_coef > 0:
            kl, clamped = kl_loss_per_token(logp, logp_ref, mask, s.kl_estimator, clamp=s.kl_clamp)
            kl_loss = aggregate(kl, mask, s.loss_agg, **total)
            loss = loss + s.kl_coef * kl_loss
            stats.kl_loss = kl_loss.detach() / units
            stats.kl_clamp_frac = clamped.sum() / mask.sum().clamp_min(1)
        if s.entropy_coef > 0:
            loss = loss - s.entropy_coef * aggregate(entropy, mask, s.loss_agg, **total)
    if entropy is not None:
        stats.entropy = entropy.detach().where(mask, 0).sum() / mask.sum().clamp_min(1)
    if values is not None:
        vl, vs = value_loss(values, values_old, returns, mask, clip_eps=s.value_clip_eps, agg=s.loss_agg, **total)
        loss = loss + s.vf_coef * vl
        stats.value_loss, stats.value_clip_frac = vl.detach() / units, vs["clip_frac"]
    return loss, stats
