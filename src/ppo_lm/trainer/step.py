"""One micro-batch of the PPO update (SPEC §1.4), or one CPU lane's share of its rows: the policy's
and the critic's losses, forward and backward, and how shares are cut and their gradients summed."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

import torch
from torch import Tensor, nn

from ..algorithms import aggregate, kl_penalty, value_loss
from ..lanes import Lanes
from ..rollout.batch import RolloutBatch

if TYPE_CHECKING:
    from .update import UpdateContext


@dataclass
class Step:
    """What the update of one micro-batch (or one lane's share of it) needs besides the rows."""

    P: int  # prompt width
    temperature: float
    policy_loss_fn: Callable[..., tuple[Tensor, dict[str, Tensor]]]
    loss_args: dict  # agg, denominator (the minibatch's global count / world), horizon
    train_policy: bool
    policy_values: bool  # the policy's value head gives the values (shared critic)
    critic_values: bool  # a separate critic gives them
    want_entropy: bool
    own_grads: bool  # return gradients (autograd.grad) instead of accumulating into .grad
    kl_coef: float = 0.0  # β of the KL loss term (the KL controller's now; 0 when the KL is in the reward)


def _backward(loss: Tensor, params: list[nn.Parameter] | None) -> tuple[bool, tuple | None]:
    """(finite, grads): back-propagate ``loss`` into ``.grad`` (``params`` None), or return its
    gradients w.r.t. ``params`` (None where a parameter is unused) without touching ``.grad``."""
    ok = bool(torch.isfinite(loss))
    if not loss.requires_grad:
        return ok, None
    if params is None:
        loss.backward()
        return ok, None
    return ok, torch.autograd.grad(loss, params, allow_unused=True)


def _policy_part(ctx: UpdateContext, mbat: RolloutBatch, st: Step, to_local: float):
    """Forward and backward of the policy's loss (clipped surrogate, KL and entropy terms; the value
    loss too with a shared critic's head). Returns (loss finite, stats, grads or None)."""
    a = ctx.cfg.algo
    m = mbat.response_mask
    ent_grad = a.entropy_coef > 0
    denom, horizon = st.loss_args["denominator"], st.loss_args["horizon"]
    out = ctx.policy_fwd(
        mbat.input_ids, mbat.attention_mask, st.P, temperature=st.temperature,
        with_entropy=st.want_entropy and st.train_policy, entropy_grad=ent_grad, with_values=st.policy_values,
    )
    logp = out.get("logp")
    loss = torch.zeros((), device=m.device)
    stats: dict[str, Tensor | float] = {}
    if st.train_policy:
        pl, ps = st.policy_loss_fn(logp, mbat.logp_old, mbat.advantages, m, clip_eps=a.clip_eps,
                                   clip_eps_high=a.clip_eps_high, dual_clip=a.dual_clip, **st.loss_args)
        loss = loss + pl
        stats.update({"policy_loss": pl.detach() * to_local,
                      "approx_kl": ps["approx_kl"], "approx_kl_k3": ps["approx_kl_k3"],
                      "policy_clip_frac": ps["clip_frac"], "dual_clip_frac": ps["dual_clip_frac"],
                      "ratio_max": ps["ratio_max"]})
        if st.kl_coef > 0:
            kl_loss = aggregate(kl_penalty(logp, mbat.logp_ref, a.kl_estimator), m, a.loss_agg,
                                denominator=denom, horizon=horizon)
            loss = loss + st.kl_coef * kl_loss
            stats["kl_loss"] = kl_loss.detach() * to_local
        if ent_grad:
            loss = loss - a.entropy_coef * aggregate(out["entropy"], m, a.loss_agg, denominator=denom, horizon=horizon)
    if "entropy" in out:
        stats["entropy"] = out["entropy"].detach().where(m, 0).sum() / m.sum()
    if st.policy_values:
        vl, vs = value_loss(out["values"][:, :-1], mbat.values_old, mbat.returns, m,
                            clip_eps=a.value_clip_eps, **st.loss_args)
        loss = loss + a.vf_coef * vl
        stats.update({"value_loss": vl.detach() * to_local, "value_clip_frac": vs["clip_frac"]})
    ok, grads = _backward(loss, ctx.policy_grad_params if st.own_grads else None)
    return ok, stats, grads


def _critic_part(ctx: UpdateContext, mbat: RolloutBatch, st: Step, to_local: float):
    """Forward and backward of a separate critic's clipped value loss. Returns (finite, stats, grads)."""
    a = ctx.cfg.algo
    values = ctx.critic_fwd(mbat.input_ids, mbat.attention_mask, st.P)
    vl, vs = value_loss(values[:, :-1], mbat.values_old, mbat.returns, mbat.response_mask,
                        clip_eps=a.value_clip_eps, **st.loss_args)
    ok, grads = _backward(a.vf_coef * vl, ctx.critic_params if st.own_grads else None)
    return ok, {"value_loss": vl.detach() * to_local, "value_clip_frac": vs["clip_frac"]}, grads


class ShareResult(NamedTuple):
    """One lane's share of a micro-batch: loss finite, stats (means over its rows), weight (the count
    of the loss's units: tokens, or sequences for the seq-mean aggregations), tokens, gradients of the
    policy's and the critic's parameters (None: none returned)."""

    finite: bool
    stats: dict[str, Tensor | float]
    weight: float
    tokens: float
    policy_grads: tuple | None
    critic_grads: tuple | None


def rows_step(ctx: UpdateContext, mbat: RolloutBatch, st: Step) -> ShareResult:
    """The policy's, then the critic's forward/backward on some rows (one after the other, so the
    policy's activations are freed before the critic's forward)."""
    m = mbat.response_mask
    tokens = float(m.sum())
    n_local = tokens if ctx.cfg.algo.loss_agg == "token-mean" else float(m.shape[0])
    to_local = float(st.loss_args["denominator"]) / max(n_local, 1.0)  # loss (÷ denominator) → local mean
    ok, stats, policy_grads, critic_grads = True, {}, None, None
    if st.train_policy or st.policy_values:
        ok, stats, policy_grads = _policy_part(ctx, mbat, st, to_local)
    if st.critic_values:
        ok_c, stats_c, critic_grads = _critic_part(ctx, mbat, st, to_local)
        ok, stats = ok and ok_c, {**stats, **stats_c}
    return ShareResult(ok, stats, n_local, tokens, policy_grads, critic_grads)


def lane_rows(idx: Tensor, batch: RolloutBatch, lanes: Lanes, hidden: int) -> list[Tensor]:
    """A micro-batch's rows ``idx`` as one share per lane (fewer when shares would be too small to
    pay, :meth:`Lanes.split`): rows by decreasing response length, dealt in turn."""
    lengths = batch.response_mask[idx].sum(1)
    order = idx[lengths.argsort(descending=True, stable=True)]
    return lanes.shares(order, batch.prompt_width + int(lengths.max()), hidden)


# Statistics that are maxima over the rows; the losses are means over the loss's own units (tokens, or
# sequences for the seq-mean aggregations); every other statistic is a mean over tokens.
MAX_STATS = ("ratio_max",)
LOSS_STATS = ("policy_loss", "value_loss", "kl_loss")


def stat_weight(key: str, weight: float, tokens: float) -> float:
    """What a share's value of statistic ``key`` counts for in a mean over shares."""
    return weight if key in LOSS_STATS else tokens


def merge_shares(shares: list[tuple[dict[str, Tensor | float], float, float]]) -> tuple[dict[str, float], float, float]:
    """One micro-batch's statistics from its lanes' (stats, weight, tokens): means weighted by
    :func:`stat_weight`, and the maximum for :data:`MAX_STATS`, so the logged values do not depend on
    the number of lanes. Returns (stats, total weight, total tokens)."""
    if len(shares) == 1:
        return shares[0]
    merged: dict[str, float] = {}
    for key in shares[0][0]:
        values = [float(s[key]) for s, _, _ in shares]
        if key in MAX_STATS:
            merged[key] = max(values)
            continue
        ws = [stat_weight(key, w, n) for _, w, n in shares]
        merged[key] = sum(v * w for v, w in zip(values, ws)) / sum(ws) if sum(ws) else values[0]
    return merged, sum(w for _, w, _ in shares), sum(n for _, _, n in shares)


def accumulate(params: list[nn.Parameter], per_lane: list[tuple | None]) -> None:
    """Add the lanes' gradients into ``.grad``, summed in lane order (deterministic). The sum is a
    new tensor (a lone share's gradient is copied): autograd may hand the same tensor, or a
    broadcast view, to several parameters, and ``.grad`` is accumulated into in place later."""
    for i, p in enumerate(params):
        parts = [grads[i] for grads in per_lane if grads is not None and grads[i] is not None]
        if not parts:
            continue
        total = parts[0] + parts[1] if len(parts) > 1 else parts[0].clone(memory_format=torch.contiguous_format)
        for g in parts[2:]:
            total += g
        p.grad = total if p.grad is None else p.grad.add_(total)
