"""Advantage estimators as pure tensor functions (docs/algorithm.md §1.3 and §3).

Conventions: per-token tensors are (B, T) over response positions; ``mask`` is 1 on valid response
tokens and right-padded; ``values[:, t]`` is V_old(x_t), the value of the context *before* response
token t. Outputs are 0 on padding, and whatever sits in padded input positions never changes an output.

References: Schulman et al. 2015 (GAE); Yue et al. 2025 (VAPO, length-adaptive λ); Shao et al. 2024
(GRPO); Liu et al. 2025 (Dr. GRPO); Ahmadian et al. 2024 (RLOO); Hu 2025 (REINFORCE++).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from ._checks import check_group_size, check_mask, check_same_shape, check_unit_interval

AllReduce = Callable[[Tensor], Tensor]
"""Sums a tensor over data-parallel ranks (identity in one process)."""


def td_residuals(
    rewards: Tensor,
    values: Tensor,
    mask: Tensor,
    *,
    gamma: float,
    terminated: Tensor | None = None,
    bootstrap_values: Tensor | None = None,
) -> Tensor:
    """TD residuals δ_t = r_t + γ·(1 − d_t)·V(x_{t+1}) − V(x_t), the terms :func:`gae` accumulates.

    V(x_{t+1}) of a row's last valid token is ``bootstrap_values`` for a truncated row and 0 for a
    terminated one (d_T = 1), so Â_t = Σ_l (γλ)^l δ_{t+l} over the row's valid tokens.

    Args:
        rewards, values: (B, T).
        mask: (B, T) right-padded validity mask.
        gamma: discount in [0, 1].
        terminated: (B,) bool; None means every row ended with a stop token.
        bootstrap_values: (B,) V_old(x_{T_i+1}); required when any row is truncated.
    Returns:
        (B, T) in the dtype of ``rewards``, 0 on padding.
    """
    check_same_shape("rewards", rewards, values=values, mask=mask)
    m = check_mask(mask)
    check_unit_interval("gamma", gamma)
    B = rewards.shape[0]
    dtype = rewards.dtype
    r = rewards.where(m, 0)
    v = values.to(dtype).where(m, 0)

    # V(x_{t+1}) for every valid t: the next column where it is valid, else the bootstrap value.
    next_mask = torch.zeros_like(m)
    next_mask[:, :-1] = m[:, 1:]
    v_next = torch.zeros_like(v)
    v_next[:, :-1] = v[:, 1:]
    if terminated is not None:
        if terminated.shape != (B,):
            raise ValueError(f"`terminated` must have shape ({B},), got {tuple(terminated.shape)}")
        truncated = ~terminated.bool()
        if bool(truncated.any()):
            if bootstrap_values is None:
                raise ValueError(
                    "`bootstrap_values` is required when some rows are truncated (terminated=False): "
                    "pass V_old of the full context after the last token"
                )
            if bootstrap_values.shape != (B,):
                raise ValueError(
                    f"`bootstrap_values` must have shape ({B},), got {tuple(bootstrap_values.shape)}"
                )
            is_last = m & ~next_mask
            boot = bootstrap_values.to(dtype).where(truncated, 0).unsqueeze(1)
            v_next = v_next + is_last.to(dtype) * boot
    deltas = (r + gamma * v_next - v).where(m, 0)
    return deltas


def gae(
    rewards: Tensor,
    values: Tensor,
    mask: Tensor,
    *,
    gamma: float,
    lam: float | Tensor,
    terminated: Tensor | None = None,
    bootstrap_values: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Generalised advantage estimation with truncation bootstrap.

    δ_t = r_t + γ·(1 − d_t)·V(x_{t+1}) − V(x_t) (:func:`td_residuals`), where V(x_{T+1}) of the last
    valid token is ``bootstrap_values`` for a truncated row and d_T = 1 for a terminated one.
    Â_t = δ_t + γλ·Â_{t+1} with Â = 0 after the last valid token; R̂_t = Â_t + V(x_t).

    Args:
        rewards, values: (B, T).
        mask: (B, T) right-padded validity mask.
        gamma: discount in [0, 1].
        lam: λ in [0, 1], a float or a (B,) tensor (per-response λ, e.g. from ``adaptive_lambda``).
        terminated: (B,) bool; None means every row ended with a stop token.
        bootstrap_values: (B,) V_old(x_{T_i+1}); required when any row is truncated.
    Returns:
        ``(advantages, returns)``, both (B, T) in the dtype of ``rewards``, 0 on padding.
        No whitening is applied.
    """
    check_same_shape("rewards", rewards, values=values, mask=mask)
    m = check_mask(mask)
    check_unit_interval("gamma", gamma)
    B, T = rewards.shape
    dtype = rewards.dtype
    if isinstance(lam, Tensor):
        if lam.shape != (B,):
            raise ValueError(f"`lam` as a tensor must have shape ({B},), got {tuple(lam.shape)}")
        check_unit_interval("lam", lam)
        lam = lam.to(dtype)
    else:
        check_unit_interval("lam", lam)
    deltas = td_residuals(rewards, values, m, gamma=gamma, terminated=terminated, bootstrap_values=bootstrap_values)
    v = values.to(dtype).where(m, 0)
    next_mask = torch.zeros_like(m)
    next_mask[:, :-1] = m[:, 1:]

    # Reverse scan, vectorised over the batch; rows are made contiguous along time for speed.
    coef = gamma * lam
    coef = coef.unsqueeze(1) if isinstance(coef, Tensor) else coef
    decay = (coef * next_mask.to(dtype)).t().contiguous()  # (T, B): zero after the last valid token
    deltas_t = deltas.t().contiguous()
    adv_t = torch.empty_like(deltas_t)
    if T:
        adv_t[T - 1] = deltas_t[T - 1]
    for t in range(T - 2, -1, -1):  # one fused kernel per step: adv[t] = δ[t] + decay[t]·adv[t+1]
        torch.addcmul(deltas_t[t], decay[t], adv_t[t + 1], out=adv_t[t])
    advantages = adv_t.t().where(m, 0)
    returns = (advantages + v).where(m, 0)
    return advantages, returns


def adaptive_lambda(lengths: Tensor, alpha: float) -> Tensor:
    """VAPO length-adaptive λ_actor = 1 − 1/(α·l), clamped to [0, 1].

    Args:
        lengths: (B,) response lengths in tokens.
        alpha: α > 0 (VAPO uses 0.05).
    Returns:
        (B,) float tensor of per-response λ.
    """
    if not float(alpha) > 0:
        raise ValueError(f"`alpha` must be > 0, got {alpha}")
    lengths = lengths.to(torch.float64 if lengths.dtype == torch.float64 else torch.float32)
    lam = 1.0 - 1.0 / (alpha * lengths.clamp_min(1e-12))
    return lam.clamp(0.0, 1.0)


def masked_mean_var(
    x: Tensor, mask: Tensor, *, unbiased: bool = True, all_reduce: AllReduce | None = None
) -> tuple[Tensor, Tensor]:
    """Mean and variance of ``x`` over valid positions (summed over ranks by ``all_reduce``).

    Two passes (mean, then squared deviations from it): the one-pass E[x²] − mean² loses all
    precision when |mean| ≫ std, e.g. fp32 rewards near a constant score.
    """
    m = check_mask(mask, right_padded=False)
    sums = torch.stack([m.sum().to(x.dtype), x.where(m, 0).sum()])
    if all_reduce is not None:
        sums = all_reduce(sums)
    n, s = sums.unbind()
    if float(n) == 0:
        raise ValueError("`mask` has no valid positions")
    mean = s / n
    ss = (x - mean).where(m, 0).square().sum()
    if all_reduce is not None:
        ss = all_reduce(ss)
    var = ss / n
    if unbiased:
        var = var * n / (n - 1) if float(n) > 1 else torch.zeros_like(var)
    return mean, var


def whiten(
    x: Tensor,
    mask: Tensor,
    shift_mean: bool = True,
    *,
    eps: float = 1e-8,
    all_reduce: AllReduce | None = None,
) -> Tensor:
    """Masked z-score: (x − mean)/sqrt(var + eps) over the valid positions of the whole batch.

    The variance is the unbiased (Bessel-corrected) masked variance. With ``shift_mean=False`` the
    mean is added back (scale only). ``all_reduce`` makes the statistics global across ranks.

    Args:
        x, mask: (B, T).
    Returns:
        (B, T), 0 on padding.
    """
    check_same_shape("x", x, mask=mask)
    m = check_mask(mask, right_padded=False)
    mean, var = masked_mean_var(x, m, all_reduce=all_reduce)
    out = (x - mean) * torch.rsqrt(var + eps)
    if not shift_mean:
        out = out + mean
    return out.where(m, 0)


def grpo_advantages(
    scores: Tensor, group_size: int, *, scale_by_std: bool = True, eps: float = 1e-6
) -> Tensor:
    """GRPO outcome advantages Âᵢ = (sᵢ − mean_g s)/(std_g s + eps); Dr. GRPO drops the division.

    Args:
        scores: (N,) laid out group-contiguous, N = n_prompts·group_size.
    Returns:
        (N,) one advantage per response (the trainer puts it on every token). std is unbiased.
    """
    if scores.dim() != 1:
        raise ValueError(f"`scores` must be 1-D (N,), got shape {tuple(scores.shape)}")
    check_group_size(scores.numel(), group_size, minimum=2 if scale_by_std else 1)
    g = scores.view(-1, group_size)
    adv = g - g.mean(1, keepdim=True)
    if scale_by_std:
        adv = adv / (g.std(1, keepdim=True) + eps)
    return adv.reshape(-1)


def rloo_advantages(scores: Tensor, group_size: int) -> Tensor:
    """RLOO leave-one-out advantages Âᵢ = sᵢ − mean_{j≠i} sⱼ.

    Args:
        scores: (N,) group-contiguous, group_size ≥ 2.
    Returns:
        (N,).
    """
    if scores.dim() != 1:
        raise ValueError(f"`scores` must be 1-D (N,), got shape {tuple(scores.shape)}")
    check_group_size(scores.numel(), group_size, minimum=2)
    g = scores.view(-1, group_size)
    baseline = (g.sum(1, keepdim=True) - g) / (group_size - 1)
    return (g - baseline).reshape(-1)


def reinforce_pp_advantages(
    rewards: Tensor, mask: Tensor, *, gamma: float = 1.0, all_reduce: AllReduce | None = None
) -> Tensor:
    """REINFORCE++: returns-to-go Â_t = Σ_{k≥t} γ^{k−t} r_k of the shaped rewards, whitened
    over the (global) batch.

    Args:
        rewards, mask: (B, T).
    Returns:
        (B, T), 0 on padding.
    """
    check_same_shape("rewards", rewards, mask=mask)
    m = check_mask(mask)
    check_unit_interval("gamma", gamma)
    r = rewards.where(m, 0).t().contiguous()
    out = torch.empty_like(r)
    T = r.shape[0]
    if T:
        out[T - 1] = r[T - 1]
    for t in range(T - 2, -1, -1):
        torch.add(r[t], out[t + 1], alpha=gamma, out=out[t])
    return whiten(out.t(), m, all_reduce=all_reduce)


@dataclass(frozen=True)
class Compaction:
    """The valid tokens of a (B, T) mask moved to the left, in order (docs/algorithm.md §1.3, turns).

    A multi-turn episode's action mask has holes — the observation tokens an environment or tool put
    between two turns. Scanning the compacted tokens is the scan that skips the holes: δ at a turn's
    last action token meets V at the next turn's first action token. ``order`` (B, T) int64: compact
    position j of row i holds token ``order[i, j]``; ``mask`` (B, T) bool, right-padded.
    """

    order: Tensor
    mask: Tensor

    def gather(self, x: Tensor) -> Tensor:
        """(B, T) → the compact layout; holes and padding land after the valid tokens."""
        return x.gather(1, self.order)

    def scatter(self, x: Tensor) -> Tensor:
        """The compact layout → (B, T); ``x`` must be 0 on compact padding (every estimator's output is),
        which then lands on the holes and the padding."""
        return torch.empty_like(x).scatter_(1, self.order, x)


def has_holes(mask: Tensor) -> bool:
    """True when some row of a (B, T) mask has a valid token after an invalid one (one host sync)."""
    m = mask.bool()
    return m.shape[-1] > 1 and bool((m[:, 1:] & ~m[:, :-1]).any())


def compact_tokens(mask: Tensor) -> Compaction:
    """:class:`Compaction` of a (B, T) 0/1 mask with any pattern of holes (a stable sort, valid first)."""
    m = mask.bool()
    T = m.shape[1]
    key = (~m).long() * T + torch.arange(T, device=m.device)
    order = torch.argsort(key, dim=1)
    counts = m.sum(1, keepdim=True)
    return Compaction(order=order, mask=torch.arange(T, device=m.device) < counts)


def broadcast_to_tokens(seq_values: Tensor, mask: Tensor) -> Tensor:
    """Put one value per response on each of its valid tokens: (B,) → (B, T), 0 on padding."""
    m = check_mask(mask, right_padded=False)
    if seq_values.shape != (m.shape[0],):
        raise ValueError(
            f"`seq_values` must have shape ({m.shape[0]},) (one value per response), got {tuple(seq_values.shape)}"
        )
    return seq_values.unsqueeze(1).expand(m.shape).where(m, 0).to(seq_values.dtype)
