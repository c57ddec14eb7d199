"""KL estimators, reward shaping, the KL loss term and KL coefficient controllers (docs/algorithm.md §1.2, §1.4).

References: Schulman 2020, "Approximating KL divergence" (k1/k2/k3);
Ziegler et al. 2019, "Fine-Tuning Language Models from Human Preferences" (adaptive β).
"""

from __future__ import annotations

import torch
from torch import Tensor

from ._checks import check_mask, check_positive, check_same_shape, checking_values

KL_ESTIMATORS = ("k1", "k2", "k3")


def kl_penalty(logp: Tensor, logp_ref: Tensor, kind: str = "k1") -> Tensor:
    """Per-token estimate of KL(π ‖ π_ref) from samples of π.

    With d = logp − logp_ref: k1 = d, k2 = ½d², k3 = (e^{−d} − 1) + d (unbiased, non-negative).

    Args:
        logp, logp_ref: (B, T) log-probabilities of the sampled tokens.
    Returns:
        (B, T) tensor; no masking is applied here.
    """
    d = logp - logp_ref
    if kind == "k1":
        return d
    if kind == "k2":
        return 0.5 * d.square()
    if kind == "k3":
        # expm1 avoids the cancellation in e^{-d} − 1, which makes k3 noisy and negative for small d.
        return torch.expm1(-d) + d
    raise ValueError(f"`kind` must be one of {KL_ESTIMATORS}, got {kind!r}")


def shape_rewards(
    scores: Tensor,
    logp_old: Tensor,
    logp_ref: Tensor,
    mask: Tensor,
    *,
    kl_coef: float,
    kl_estimator: str = "k1",
    step_rewards: Tensor | None = None,
) -> Tensor:
    """Shaped per-token rewards r_t = step_t − β·kl_t, plus the score at the last valid token.

    Args:
        scores: (B,) scalar score per response.
        logp_old, logp_ref: (B, T) log-probs of the sampled tokens under π_old and π_ref.
        mask: (B, T) validity mask, every row with at least one valid token; right-padded, or with holes
            (a multi-turn episode's observation tokens): the score lands on the last valid token.
        step_rewards: (B, T) process rewards on the tokens that complete their steps (docs/algorithm.md
            §2.1), or None; what sits on padding is ignored.
    Returns:
        (B, T) rewards, 0 on padding.
    """
    check_same_shape("logp_old", logp_old, logp_ref=logp_ref, mask=mask)
    m = check_mask(mask, right_padded=False)
    if scores.shape != (m.shape[0],):
        raise ValueError(f"`scores` must have shape ({m.shape[0]},), got {tuple(scores.shape)}")
    if float(kl_coef) < 0:
        raise ValueError(f"`kl_coef` must be >= 0, got {kl_coef}")
    if kl_estimator not in KL_ESTIMATORS:
        raise ValueError(f"`kl_estimator` must be one of {KL_ESTIMATORS}, got {kl_estimator!r}")
    lengths = m.sum(1)
    if checking_values() and bool((lengths == 0).any()):
        raise ValueError("`mask` has an empty row: every response needs at least one token to carry its score")
    kl = kl_penalty(logp_old.where(m, 0), logp_ref.where(m, 0), kl_estimator)
    rewards = (-kl_coef * kl).where(m, 0).to(logp_old.dtype)
    if step_rewards is not None:
        check_same_shape("step_rewards", step_rewards, mask=mask)
        rewards = rewards + step_rewards.to(rewards.dtype).where(m, 0)
    T = m.shape[1]
    last = (T - 1 - m.flip(1).int().argmax(1)).unsqueeze(1)  # the last valid token (lengths − 1 when right-padded)
    return rewards.scatter_add(1, last, scores.to(rewards.dtype).unsqueeze(1))


def episode_returns(scores: Tensor, step_rewards: Tensor | None, mask: Tensor) -> Tensor:
    """(B,) each episode's total reward without the KL: its score plus its step rewards on the sampled
    tokens ``mask`` (B, T) — a multi-turn episode's earlier turns, a reward's process steps; the scores
    alone without step rewards. What the critic-free estimators compare within a group (docs/algorithm.md §3)."""
    if step_rewards is None:
        return scores
    return scores + step_rewards.where(mask.bool(), 0).sum(1)


def kl_loss_per_token(
    logp: Tensor, logp_ref: Tensor, mask: Tensor, kind: str = "k3", *, clamp: float | None = None
) -> tuple[Tensor, Tensor]:
    """Per-token KL of a KL *loss* term, and which tokens the clamp cut (docs/algorithm.md §1.4).

    Padded positions are zeroed before the estimator, not after: a pad's log-prob may be far below
    −88.7, where k3's e^{−d} overflows to inf and masking afterwards would turn 0·inf into NaN
    gradients. ``clamp``: the KL is clipped to [−clamp, clamp] as verl and OpenRLHF do (k3 at a
    log-ratio of −30 is ≈ 1e13); clipped tokens pass no gradient. None: no clamp.

    What the estimators' gradients are as a loss (on-policy, through ``logp`` only): k1's expected
    gradient is 0, k2's is ∇KL(π‖π_ref), k3's is ∇KL(π_ref‖π) (the forward KL, although k3's value
    estimates KL(π‖π_ref)); see docs/algorithm.md §1.4.

    Args:
        logp: (B, T) differentiable log π_θ of the sampled tokens; logp_ref, mask: (B, T).
    Returns:
        (kl (B, T), 0 on padding; clamped (B, T) bool, False on padding).
    """
    check_same_shape("logp", logp, logp_ref=logp_ref, mask=mask)
    m = check_mask(mask, right_padded=False)
    check_positive("clamp", clamp)
    kl = kl_penalty(logp.where(m, 0), logp_ref.detach().where(m, 0), kind)
    if clamp is None:
        return kl.where(m, 0), torch.zeros_like(m)
    clamped = (kl.detach().abs() > clamp) & m
    return kl.clamp(-clamp, clamp).where(m, 0), clamped


class FixedKLController:
    """Constant β."""

    def __init__(self, kl_coef: float):
        if kl_coef < 0:
            raise ValueError(f"`kl_coef` must be >= 0, got {kl_coef}")
        self.value = float(kl_coef)

    def update(self, current_kl: float, n_steps: int) -> None:
        """No-op: β is fixed."""

    def state_dict(self) -> dict:
        return {"value": self.value}

    def load_state_dict(self, state: dict) -> None:
        self.value = float(state["value"])


class AdaptiveKLController:
    """Adaptive β (Ziegler et al. 2019, §2.2).

    e = clip((KL − target)/target, −0.2, 0.2);  β ← β·(1 + e·n_steps/horizon).
    ``current_kl`` is the mean per-response KL sum; ``n_steps`` the number of episodes in the batch.
    """

    def __init__(self, init_kl_coef: float, target: float, horizon: float):
        if init_kl_coef < 0:
            raise ValueError(f"`init_kl_coef` must be >= 0, got {init_kl_coef}")
        check_positive("target", target)
        check_positive("horizon", horizon)
        self.value = float(init_kl_coef)
        self.target = float(target)
        self.horizon = float(horizon)

    def update(self, current_kl: float, n_steps: int) -> None:
        error = min(max(float(current_kl) / self.target - 1.0, -0.2), 0.2)
        self.value *= 1.0 + error * n_steps / self.horizon

    def state_dict(self) -> dict:
        return {"value": self.value, "target": self.target, "horizon": self.horizon}

    def load_state_dict(self, state: dict) -> None:
        self.value = float(state["value"])
