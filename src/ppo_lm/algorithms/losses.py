"""PPO losses and per-token diagnostics as pure tensor functions (docs/algorithm.md §1.4).

Every loss takes per-token (B, T) tensors and a right-padded ``mask`` and returns ``(loss, stats)``:
``loss`` a differentiable scalar, ``stats`` a dict of detached 0-dim tensors (token means over the
valid positions of this call). Only ``logp``/``values`` carry gradient; advantages, returns,
``logp_old`` and ``values_old`` are treated as data.

References: Schulman et al. 2017 (PPO); Ye et al. 2020 (dual-clip); Yue et al. 2025 (VAPO,
clip-higher, token-level loss); Liu et al. 2025 (Dr. GRPO aggregation).
"""

from __future__ import annotations

import torch
from torch import Tensor

from ._checks import check_mask, check_positive, check_same_shape
from .advantages import AllReduce, masked_mean_var

AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm")


def aggregate(
    x: Tensor,
    mask: Tensor,
    mode: str = "token-mean",
    *,
    denominator: float | Tensor | None = None,
    horizon: float | None = None,
) -> Tensor:
    """Reduce a per-token loss to a scalar.

    - ``token-mean``: Σ_valid x / n_tokens.
    - ``seq-mean-token-mean``: mean over responses of each response's token mean.
    - ``seq-mean-token-sum-norm``: mean over responses of (Σ_t x_t)/horizon (Dr. GRPO), where
      ``horizon`` is a constant (default T, the padded length) so long answers are not down-weighted.

    ``denominator`` overrides the count divided by (tokens for token-mean, responses otherwise); the
    trainer passes the count of the whole minibatch across micro-batches and ranks so that gradient
    accumulation and data parallelism give exactly the full-batch loss.

    Args:
        x, mask: (B, T). Returns a 0-dim tensor.
    """
    check_same_shape("x", x, mask=mask)
    m = check_mask(mask, right_padded=False)
    xm = x.where(m, 0)
    if mode == "token-mean":
        num = xm.sum()
        den = m.sum() if denominator is None else denominator
    elif mode == "seq-mean-token-mean":
        lengths = m.sum(1)
        num = (xm.sum(1) / lengths.clamp_min(1)).sum()
        den = (lengths > 0).sum() if denominator is None else denominator
    elif mode == "seq-mean-token-sum-norm":
        num = xm.sum() / (float(horizon) if horizon is not None else m.shape[1])
        den = m.shape[0] if denominator is None else denominator
    else:
        raise ValueError(f"`agg` must be one of {AGG_MODES}, got {mode!r}")
    if not isinstance(den, Tensor):
        den = torch.tensor(float(den), dtype=x.dtype, device=x.device)
    return num / den.to(x.dtype).clamp_min(1)


def loss_units(mask: Tensor, mode: str = "token-mean") -> float:
    """How many units a loss aggregated by ``mode`` averages over on these rows: valid tokens for
    ``token-mean``, responses for the seq-mean modes. The weight of this call's losses in a mean
    over several calls (micro-batches, CPU lanes, ranks). Reads the count back to the host."""
    return float(mask.sum()) if mode == "token-mean" else float(mask.shape[0])


def _token_mean(x: Tensor, m: Tensor) -> Tensor:
    return (x.where(m, 0).sum() / m.sum().clamp_min(1)).detach()


def policy_loss(
    logp: Tensor,
    logp_old: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_eps: float = 0.2,
    clip_eps_high: float | None = None,
    dual_clip: float | None = None,
    agg: str = "token-mean",
    denominator: float | Tensor | None = None,
    horizon: float | None = None,
    weights: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """PPO clipped surrogate: −min(ρÂ, clip(ρ, 1−ε_low, 1+ε_high)Â), aggregated by ``agg``.

    ρ = exp(logp − logp_old). ``clip_eps_high`` enables clip-higher (DAPO/VAPO); ``dual_clip`` = c > 1
    bounds the loss for Â < 0 at −c·Â (Ye et al. 2020). ``weights`` (B, T): an off-policy correction's
    per-token weight on each token's loss (:mod:`.off_policy`; data), None for 1.

    Args:
        logp: (B, T) log π_θ of the sampled tokens (differentiable).
        logp_old, advantages: (B, T) data (detached here).
        mask: (B, T).
    Returns:
        ``(loss, stats)`` with stats ``clip_frac`` (fraction of valid tokens whose clipped term is
        the active one), ``dual_clip_frac``, ``approx_kl`` (mean ½(logp − logp_old)²), ``approx_kl_k3``,
        ``ratio_max``.
    """
    check_same_shape("logp", logp, logp_old=logp_old, advantages=advantages, mask=mask)
    m = check_mask(mask, right_padded=False)
    check_positive("clip_eps", clip_eps)
    check_positive("clip_eps_high", clip_eps_high)
    if dual_clip is not None and not float(dual_clip) > 1:
        raise ValueError(f"`dual_clip` must be > 1, got {dual_clip}")
    eps_high = clip_eps if clip_eps_high is None else clip_eps_high
    adv = advantages.detach().where(m, 0)
    log_ratio = (logp - logp_old.detach()).where(m, 0)
    ratio = log_ratio.exp()
    loss_unclipped = -adv * ratio
    loss_clipped = -adv * ratio.clamp(1.0 - clip_eps, 1.0 + eps_high)
    losses = torch.maximum(loss_unclipped, loss_clipped)
    stats = {"clip_frac": _token_mean((loss_clipped > loss_unclipped).to(logp.dtype), m)}
    if dual_clip is not None:
        bound = -dual_clip * adv
        dual_active = (adv < 0) & (losses > bound)
        losses = torch.where(adv < 0, torch.minimum(losses, bound), losses)
        stats["dual_clip_frac"] = _token_mean(dual_active.to(logp.dtype), m)
    else:
        stats["dual_clip_frac"] = torch.zeros((), dtype=logp.dtype, device=logp.device)
    stats.update(_ratio_stats(log_ratio, m))
    if weights is not None:
        losses = losses * weights.detach()
    loss = aggregate(losses, m, agg, denominator=denominator, horizon=horizon)
    return loss, stats


def _ratio_stats(log_ratio: Tensor, m: Tensor) -> dict[str, Tensor]:
    """How far π_θ has moved from π_old on the sampled tokens, d = logp − logp_old (B, T), 0 on padding:
    ``approx_kl`` ½d² (k2) and ``approx_kl_k3`` (e^d − 1) − d (k3), both estimates of KL(π_old ‖ π_θ)
    from tokens drawn from π_old — k3 unbiased and ≥ 0 (Schulman 2020, with r = π_θ/π_old = e^d) —
    and ``ratio_max`` (0-dim)."""
    d = log_ratio.detach()
    return {
        "approx_kl": _token_mean(0.5 * d.square(), m),
        "approx_kl_k3": _token_mean(torch.expm1(d) - d, m),
        "ratio_max": d.exp().where(m, float("-inf")).max().clamp_min(0),
    }


def pg_loss(
    logp: Tensor,
    logp_old: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    agg: str = "token-mean",
    denominator: float | Tensor | None = None,
    horizon: float | None = None,
    weights: Tensor | None = None,
    **_: object,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Unclipped importance-weighted policy gradient −ρÂ (equals REINFORCE on the first step).

    Same arguments and stats as :func:`policy_loss`; clipping arguments are ignored.
    """
    check_same_shape("logp", logp, logp_old=logp_old, advantages=advantages, mask=mask)
    m = check_mask(mask, right_padded=False)
    log_ratio = (logp - logp_old.detach()).where(m, 0)
    ratio = log_ratio.exp()
    losses = -advantages.detach().where(m, 0) * ratio
    if weights is not None:
        losses = losses * weights.detach()
    zero = torch.zeros((), dtype=logp.dtype, device=logp.device)
    stats = {"clip_frac": zero, "dual_clip_frac": zero, **_ratio_stats(log_ratio, m)}
    return aggregate(losses, m, agg, denominator=denominator, horizon=horizon), stats


def value_loss(
    values: Tensor,
    values_old: Tensor,
    returns: Tensor,
    mask: Tensor,
    *,
    clip_eps: float | None = None,
    agg: str = "token-mean",
    denominator: float | Tensor | None = None,
    horizon: float | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Critic loss (V − R̂)², or max((V − R̂)², (clip(V, V_old ± ε_v) − R̂)²) when ``clip_eps`` is set.

    No ½ factor. Args: (B, T) each; ``values`` differentiable, the rest data.
    Returns ``(loss, stats)`` with ``clip_frac`` (fraction where the clipped term is active).
    """
    check_same_shape("values", values, values_old=values_old, returns=returns, mask=mask)
    m = check_mask(mask, right_padded=False)
    check_positive("clip_eps", clip_eps)
    ret = returns.detach().where(m, 0)
    v = values.where(m, 0)
    losses = (v - ret).square()
    if clip_eps is not None:
        v_old = values_old.detach().where(m, 0)
        v_clipped = v_old + (v - v_old).clamp(-clip_eps, clip_eps)
        losses_clipped = (v_clipped - ret).square()
        clip_frac = _token_mean((losses_clipped > losses).to(values.dtype), m)
        losses = torch.maximum(losses, losses_clipped)
    else:
        clip_frac = torch.zeros((), dtype=values.dtype, device=values.device)
    loss = aggregate(losses, m, agg, denominator=denominator, horizon=horizon)
    return loss, {"clip_frac": clip_frac}


def entropy_from_logits(logits: Tensor) -> Tensor:
    """Entropy of the categorical distribution softmax(logits): (..., V) → (...), fp32 for half
    precision input. Safe at p = 0 (-inf logits): those entries add 0, and gradients stay finite.
    The policy's forward uses it for the entropy diagnostic and bonus."""
    logp = torch.log_softmax(logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits, -1)
    p = logp.exp()
    # 0·log 0 = 0: zero-probability entries (e.g. -inf logits) must not turn the sum into NaN.
    return -(p * logp.masked_fill(p == 0, 0)).sum(-1)


def explained_variance(values: Tensor, returns: Tensor, mask: Tensor, *,
                       all_reduce: AllReduce | None = None) -> Tensor:
    """1 − Var(R̂ − V)/Var(R̂) over valid positions — of every rank when ``all_reduce`` sums over
    ranks — (NaN when Var(R̂) = 0). Args (B, T); 0-dim out."""
    check_same_shape("values", values, returns=returns, mask=mask)
    m = check_mask(mask, right_padded=False)
    r = returns.detach()
    _, var_r = masked_mean_var(r, m, unbiased=False, all_reduce=all_reduce)
    _, var_d = masked_mean_var(r - values.detach(), m, unbiased=False, all_reduce=all_reduce)
    if float(var_r) == 0:
        return torch.full((), float("nan"), dtype=values.dtype, device=values.device)
    return 1 - var_d / var_r
