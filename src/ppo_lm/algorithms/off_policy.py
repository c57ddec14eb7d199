"""Off-policy corrections as pure tensor functions (docs/algorithm.md §1.6).

A trajectory is sampled by a behaviour policy π_behav — an older version of the weights (a producer
that samples while the learner trains), or the same weights through another engine's numerics — and
the update clips against the proximal policy π_prox, the learner's weights when it takes the batch
(``logp_old``, recomputed by the learner's scoring forward). Each correction turns the per-token
log-ratio log w_t = log π_prox(a_t) − log π_behav(a_t) into a weight on the clipped surrogate:

    L = Σ_t c_t · max(−ρ_t Â_t, −clip(ρ_t, 1 − ε, 1 + ε) Â_t),    ρ_t = π_θ(a_t) / π_prox(a_t)

- ``decoupled``: c_t = w_t (decoupled PPO: Hilton et al. 2022, "Batch size-invariance for policy
  optimization"; Fu et al. 2025, AReaL) — the surrogate's expectation under π_behav equals PPO's under π_prox.
- ``tis``: c_t = min(w_t, C), truncated importance sampling (Ionides 2008; Yao et al. 2025, "Your
  efficient RL framework secretly brings you off-policy RL training"): bounded variance, some bias.
- ``token-mask``: c_t = 1 if w_t ∈ [low, high] else 0 — tokens whose behaviour and proximal
  probabilities disagree too much carry no gradient (IcePop, Ling Team 2025).
- ``sequence-mask``: c_t = 1 for every token of a response whose geometric-mean ratio
  exp(mean_t log w_t) ∈ [low, high], else 0 (the sequence-level variant: one verdict per response).

Weights are data (no gradient); a masked token stays in the loss's denominator, so masking lowers
the step rather than reweighting the rest. With π_behav = π_prox every weight is 1.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from ._checks import check_mask, check_positive, check_same_shape


@dataclass(frozen=True)
class CorrectionSettings:
    """cap: C of ``tis`` (> 1); low, high: the band of ``token-mask`` and ``sequence-mask`` (0 < low < 1 < high)."""

    cap: float = 2.0
    low: float = 0.5
    high: float = 2.0


Correction = Callable[[Tensor, Tensor, CorrectionSettings], Tensor]
"""``f(log_w (B, T) zero off the mask, mask (B, T) bool, settings) -> c (B, T)`` (values off the mask unused)."""

OFF_POLICY_CORRECTIONS: dict[str, Correction] = {}
"""The corrections by name (``algo.off_policy_correction``), each registered where it is defined."""


def correction(name: str) -> Callable[[Correction], Correction]:
    def register(fn: Correction) -> Correction:
        if name in OFF_POLICY_CORRECTIONS:
            raise ValueError(f"off-policy correction {name!r} is registered twice")
        OFF_POLICY_CORRECTIONS[name] = fn
        return fn

    return register


@correction("decoupled")
def _decoupled(log_w: Tensor, m: Tensor, s: CorrectionSettings) -> Tensor:
    return log_w.exp()


@correction("tis")
def _truncated(log_w: Tensor, m: Tensor, s: CorrectionSettings) -> Tensor:
    return log_w.exp().clamp_max(s.cap)


@correction("token-mask")
def _token_mask(log_w: Tensor, m: Tensor, s: CorrectionSettings) -> Tensor:
    w = log_w.exp()
    return ((w >= s.low) & (w <= s.high)).to(log_w.dtype)


@correction("sequence-mask")
def _sequence_mask(log_w: Tensor, m: Tensor, s: CorrectionSettings) -> Tensor:
    geo = (log_w.where(m, 0).sum(1) / m.sum(1).clamp_min(1)).exp()  # (B,) geometric-mean ratio
    keep = (geo >= s.low) & (geo <= s.high)
    return keep.to(log_w.dtype).unsqueeze(1).expand_as(log_w)


def _none(log_w: Tensor, m: Tensor, s: CorrectionSettings) -> Tensor:
    """No correction: every weight 1 (its statistics still say what the sampler's lag did)."""
    return torch.ones_like(log_w)


CorrectionName = Literal[("none", *OFF_POLICY_CORRECTIONS)]  # type: ignore[valid-type]
"""``algo.off_policy_correction``: 'none' or a registered correction (the registry is the one list)."""


def off_policy_weights(logp_prox: Tensor, logp_behav: Tensor, mask: Tensor, name: str,
                       settings: CorrectionSettings = CorrectionSettings()) -> tuple[Tensor, dict[str, Tensor]]:
    """The correction ``name``'s per-token weights c (B, T) (0 off the mask; detached) and statistics
    ('none': weights 1, for its statistics).

    Args:
        logp_prox: (B, T) log π_prox of the sampled tokens (the learner's, at taking the batch).
        logp_behav: (B, T) log π_behav of them (the sampler's).
        mask: (B, T) the sampled tokens.
    Returns ``(c, stats)``; stats (0-dim, means over the valid tokens): ``is_weight_mean`` and
    ``is_weight_max`` of w = π_prox/π_behav before the correction, ``off_policy_cut_frac`` — the share
    of tokens the correction changed (truncated by ``tis``, masked by the masks; 0 for ``decoupled``),
    ``kl_behav_prox`` — KL(π_behav ‖ π_prox) by the k3 estimator (w − 1) − log w on tokens π_behav
    sampled (Schulman 2020)."""
    check_same_shape("logp_prox", logp_prox, logp_behav=logp_behav, mask=mask)
    m = check_mask(mask, right_padded=False)
    try:
        fn = _none if name == "none" else OFF_POLICY_CORRECTIONS[name]
    except KeyError:
        raise ValueError(f"unknown off-policy correction {name!r}; choose one of "
                         f"{sorted(OFF_POLICY_CORRECTIONS)}") from None
    check_positive("cap", settings.cap)
    if not 0 < settings.low <= 1 <= settings.high:
        raise ValueError(f"the band must hold 1 with 0 < low ≤ 1 ≤ high, got [{settings.low}, {settings.high}]")
    log_w = (logp_prox.detach() - logp_behav.detach()).where(m, 0)
    c = fn(log_w, m, settings).where(m, 0)
    w = log_w.exp()
    n = m.sum().clamp_min(1)
    if name == "tis":
        changed = (w > settings.cap) & m
    elif name in ("none", "decoupled"):
        changed = torch.zeros_like(m)
    else:  # the masks
        changed = (c == 0) & m
    stats = {
        "is_weight_mean": w.where(m, 0).sum() / n,
        "is_weight_max": w.where(m, float("-inf")).max().clamp_min(0) if m.any() else w.new_zeros(()),
        "off_policy_cut_frac": changed.sum() / n,
        "kl_behav_prox": (torch.expm1(log_w) - log_w).where(m, 0).sum() / n,
    }
    return c, stats
