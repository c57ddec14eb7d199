"""Off-policy corrections as pure tensor functions (docs/algorithm.md §1.6).

A trajectory is sampled by a behaviour policy π_behav — an older version of the weights (a producer
that samples while the learner trains), or the same weights through another engine's numerics — and
the update clips against the proximal policy π_prox, the learner's weights when it takes the batch
(``logp_old``, recomputed by the learner's scoring forward). A correction turns the per-token ratio
w_t = π_prox(a_t) / π_behav(a_t) into a weight c_t on the clipped surrogate:

    L = Σ_t c_t · max(−ρ_t Â_t, −clip(ρ_t, 1 − ε, 1 + ε) Â_t),    ρ_t = π_θ(a_t) / π_prox(a_t)

c is three named parts multiplied: a **weight** (:data:`IS_WEIGHTS`), a **mask** (:data:`IS_MASKS`,
optional) and a **veto** (optional: any token of a response with w_t below a floor rejects the whole
response — verl's rollout correction ``rollout_token_veto_threshold``, prime-rl's token mask floor).
The named corrections (:data:`OFF_POLICY_CORRECTIONS`) are the references' own combinations:

- ``decoupled``: weight w_t, mask w_t ≤ C — decoupled PPO (Hilton et al. 2022, "Batch size-invariance
  for policy optimization") with AReaL's cap (Fu et al. 2025; ``behav_imp_weight_cap``: tokens whose
  ratio exceeds it carry no gradient).
- ``tis``: weight min(w_t, C), truncated importance sampling per token (Ionides 2008; Yao et al. 2025,
  "Your efficient RL framework secretly brings you off-policy RL training").
- ``token-mask``: weight w_t, mask w_t ∈ [low, high] — IcePop (Ling Team 2025): the ratio kept inside
  the band, zero outside.
- ``sequence-tis``: weight min(Π_t w_t, C) on every token of a response — sequence-level TIS (verl's
  rollout correction, ``rollout_is: sequence``).
- ``sequence-mask``: weight 1, mask exp(mean_t log w_t) ∈ [low, high] per response — the geometric
  rejection of verl's rollout correction (``rollout_rs: geometric``).

Weights are data (no gradient); a masked token stays in the loss's denominator, so masking lowers
the step rather than reweighting the rest. With π_behav = π_prox every weight is 1. Statistics come
as sums (:class:`OffPolicySums`) so a sharded batch adds up across ranks to the whole batch's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Literal

import torch
from torch import Tensor

from ._checks import check_mask, check_positive, check_same_shape


@dataclass(frozen=True)
class CorrectionSettings:
    """cap: C of the truncated weights and of ``decoupled``'s cap (> 1); low, high: the band of the masks
    (0 < low ≤ 1 ≤ high); veto: the token floor of the veto (None: no veto)."""

    cap: float = 2.0
    low: float = 0.5
    high: float = 2.0
    veto: float | None = None


WeightFn = Callable[[Tensor, Tensor, CorrectionSettings], tuple[Tensor, Tensor]]
"""``f(log_w (B, T) zero off the mask, mask (B, T) bool, settings) -> (weight (B, T), truncated (B, T) bool)``."""
MaskFn = Callable[[Tensor, Tensor, CorrectionSettings], Tensor]
"""``f(log_w (B, T), mask (B, T) bool, settings) -> keep (B, T) bool`` (values off the mask unused)."""

IS_WEIGHTS: dict[str, WeightFn] = {}
"""The weight part by name, each registered where it is defined."""
IS_MASKS: dict[str, MaskFn] = {}
"""The mask part by name, each registered where it is defined."""


def _registrar(registry: dict, kind: str, name: str):
    def register(fn):
        if name in registry:
            raise ValueError(f"{kind} {name!r} is registered twice")
        registry[name] = fn
        return fn

    return register


def is_weight(name: str) -> Callable[[WeightFn], WeightFn]:
    return _registrar(IS_WEIGHTS, "importance weight", name)


def is_mask(name: str) -> Callable[[MaskFn], MaskFn]:
    return _registrar(IS_MASKS, "importance mask", name)


@is_weight("one")
def _one(log_w: Tensor, m: Tensor, s: CorrectionSettings) -> tuple[Tensor, Tensor]:
    return torch.ones_like(log_w), torch.zeros_like(m)


@is_weight("token")
def _token(log_w: Tensor, m: Tensor, s: CorrectionSettings) -> tuple[Tensor, Tensor]:
    return log_w.exp(), torch.zeros_like(m)


@is_weight("token-truncated")
def _token_truncated(log_w: Tensor, m: Tensor, s: CorrectionSettings) -> tuple[Tensor, Tensor]:
    w = log_w.exp()
    return w.clamp_max(s.cap), w > s.cap


@is_weight("sequence-truncated")
def _sequence_truncated(log_w: Tensor, m: Tensor, s: CorrectionSettings) -> tuple[Tensor, Tensor]:
    log_seq = log_w.where(m, 0).sum(1, keepdim=True)  # (B, 1) log Π_t w_t, capped before exp (no overflow)
    cap = torch.tensor(s.cap, dtype=log_w.dtype).log()
    return log_seq.clamp_max(cap).exp().expand_as(log_w), (log_seq > cap).expand_as(m)


@is_mask("token-band")
def _token_band(log_w: Tensor, m: Tensor, s: CorrectionSettings) -> Tensor:
    w = log_w.exp()
    return (w >= s.low) & (w <= s.high)


@is_mask("token-cap")
def _token_cap(log_w: Tensor, m: Tensor, s: CorrectionSettings) -> Tensor:
    return log_w.exp() <= s.cap


@is_mask("sequence-band")
def _sequence_band(log_w: Tensor, m: Tensor, s: CorrectionSettings) -> Tensor:
    geo = (log_w.where(m, 0).sum(1) / m.sum(1).clamp_min(1)).exp()  # (B,) geometric-mean ratio
    return ((geo >= s.low) & (geo <= s.high)).unsqueeze(1).expand_as(m)


@dataclass(frozen=True)
class Correction:
    """A weight part and an optional mask part, by their names in :data:`IS_WEIGHTS` and :data:`IS_MASKS`."""

    weight: str
    mask: str | None = None


OFF_POLICY_CORRECTIONS: dict[str, Correction] = {}
"""The named corrections (``algo.off_policy_correction``), the references' combinations of the parts."""


def correction(name: str, weight: str, mask: str | None = None) -> Correction:
    if name in OFF_POLICY_CORRECTIONS:
        raise ValueError(f"off-policy correction {name!r} is registered twice")
    OFF_POLICY_CORRECTIONS[name] = Correction(weight, mask)
    return OFF_POLICY_CORRECTIONS[name]


correction("decoupled", "token", "token-cap")  # AReaL
correction("tis", "token-truncated")
correction("token-mask", "token", "token-band")  # IcePop
correction("sequence-tis", "sequence-truncated")  # verl rollout_is: sequence
correction("sequence-mask", "one", "sequence-band")  # verl rollout_rs: geometric
_NONE = Correction("one")

CorrectionName = Literal[("none", *OFF_POLICY_CORRECTIONS)]  # type: ignore[valid-type]
"""``algo.off_policy_correction``: 'none' or a registered correction (the registry is the one list)."""
MaskName = Literal[("none", *IS_MASKS)]  # type: ignore[valid-type]
"""``algo.off_policy_mask``: a mask part in place of the correction's own, or 'none' for no mask."""


def resolve_correction(name: str, mask: str | None = None) -> Correction:
    """The parts of the correction ``name`` ('none': weights 1), its mask replaced by ``mask`` where given
    ('none': no mask)."""
    try:
        chosen = _NONE if name == "none" else OFF_POLICY_CORRECTIONS[name]
    except KeyError:
        raise ValueError(f"unknown off-policy correction {name!r}; choose one of "
                         f"{['none', *OFF_POLICY_CORRECTIONS]}") from None
    if mask is None:
        return chosen
    if mask != "none" and mask not in IS_MASKS:
        raise ValueError(f"unknown importance mask {mask!r}; choose one of {['none', *IS_MASKS]}")
    return Correction(chosen.weight, None if mask == "none" else mask)


@dataclass
class OffPolicySums:
    """A batch's correction statistics as sums (0-dim tensors; float64), so that ranks' shares add up:
    ``tokens`` and ``sequences`` counted (a sequence: a response with a valid token); ``w_sum``, ``w_max``,
    ``kl_sum`` of the ratio w before the correction; tokens ``truncated`` by the weight, ``masked`` by the
    mask or the veto; sequences ``vetoed``; ``c_sum`` and ``c_sq_sum`` of the weights applied."""

    tokens: Tensor
    sequences: Tensor
    w_sum: Tensor
    w_max: Tensor
    kl_sum: Tensor
    truncated: Tensor
    masked: Tensor
    vetoed: Tensor
    c_sum: Tensor
    c_sq_sum: Tensor

    def reduced(self, all_reduce_sum: Callable[[Tensor], Tensor], all_reduce_max: Callable[[Tensor], Tensor]
                ) -> OffPolicySums:
        """The sums over every rank (``w_max``: the largest), in two collectives."""
        names = [f.name for f in fields(self) if f.name != "w_max"]
        total = all_reduce_sum(torch.stack([getattr(self, n) for n in names]))
        return OffPolicySums(**dict(zip(names, total.unbind())), w_max=all_reduce_max(self.w_max))

    def metrics(self) -> dict[str, float]:
        """``is_weight_mean``, ``is_weight_max`` and ``kl_behav_prox`` — KL(π_behav ‖ π_prox) by the k3
        estimator (w − 1) − log w on the tokens π_behav sampled (Schulman 2020) — of the ratio before the
        correction; the shares of tokens ``off_policy_truncated_frac``, ``off_policy_masked_frac`` (by the
        mask or the veto) and ``off_policy_cut_frac`` (either); the share of responses
        ``off_policy_vetoed_frac``; ``is_ess``, the effective sample size of the applied weights as a share
        of the tokens, (Σc)² / (n Σc²) (Kong 1992; 1 = uniform, 0 = nothing kept)."""
        n, seqs = float(self.tokens), float(self.sequences)
        per = (lambda x: float(x) / n) if n else (lambda x: 0.0)
        return {
            "is_weight_mean": per(self.w_sum),
            "is_weight_max": float(self.w_max),
            "kl_behav_prox": per(self.kl_sum),
            "off_policy_truncated_frac": per(self.truncated),
            "off_policy_masked_frac": per(self.masked),
            "off_policy_cut_frac": per(self.truncated + self.masked),
            "off_policy_vetoed_frac": float(self.vetoed) / seqs if seqs else 0.0,
            "is_ess": float(self.c_sum) ** 2 / (n * float(self.c_sq_sum)) if n and float(self.c_sq_sum) else 0.0,
        }


def off_policy_weights(logp_prox: Tensor, logp_behav: Tensor, mask: Tensor, name: str | Correction,
                       settings: CorrectionSettings = CorrectionSettings()) -> tuple[Tensor, OffPolicySums]:
    """The correction's per-token weights c = weight · mask · (1 − veto) (B, T) (0 off the mask; detached)
    and its statistics' sums.

    Args:
        logp_prox: (B, T) log π_prox of the sampled tokens (the learner's, at taking the batch).
        logp_behav: (B, T) log π_behav of them (the sampler's).
        mask: (B, T) the sampled tokens.
        name: a registered correction's name, 'none' (weights 1, for the statistics), or the parts
            (:func:`resolve_correction`).
        settings: the cap, the band and the veto's floor.
    """
    check_same_shape("logp_prox", logp_prox, logp_behav=logp_behav, mask=mask)
    m = check_mask(mask, right_padded=False)
    parts = name if isinstance(name, Correction) else resolve_correction(name)
    check_positive("cap", settings.cap)
    if not 0 < settings.low <= 1 <= settings.high:
        raise ValueError(f"the band must hold 1 with 0 < low ≤ 1 ≤ high, got [{settings.low}, {settings.high}]")
    if settings.veto is not None and not 0 < settings.veto < 1:
        raise ValueError(f"the veto's floor must lie in (0, 1), got {settings.veto}")
    log_w = (logp_prox.detach() - logp_behav.detach()).where(m, 0)
    weight, truncated = IS_WEIGHTS[parts.weight](log_w, m, settings)
    keep = IS_MASKS[parts.mask](log_w, m, settings) if parts.mask is not None else torch.ones_like(m)
    w = log_w.exp()
    vetoed = torch.zeros(m.shape[0], dtype=torch.bool, device=m.device)
    if settings.veto is not None:
        vetoed = ((w < settings.veto) & m).any(1)
    keep = keep & ~vetoed.unsqueeze(1) & m
    c = weight.where(keep, 0)
    truncated = truncated & keep
    d = torch.float64
    sums = OffPolicySums(
        tokens=m.sum().to(d), sequences=m.any(1).sum().to(d),
        w_sum=w.where(m, 0).sum().to(d),
        w_max=w.where(m, float("-inf")).max().clamp_min(0).to(d) if m.any() else torch.zeros((), dtype=d),
        kl_sum=(torch.expm1(log_w) - log_w).where(m, 0).sum().to(d),
        truncated=truncated.sum().to(d), masked=(m & ~keep).sum().to(d), vetoed=(vetoed & m.any(1)).sum().to(d),
        c_sum=c.sum().to(d), c_sq_sum=c.double().square().sum(),
    )
    return c, sums
