"""Step 4 of the loop (docs/algorithm.md §1.4): K epochs × minibatches × micro-batches of PPO updates on a
fixed rollout (the critic's own number of epochs with ``critic.epochs``), read top to bottom in
:func:`ppo_update`.

Per micro-batch: forward, objective (:func:`~ppo_lm.algorithms.ppo_objective`), backward
(:meth:`Learner.backward <ppo_lm.trainer.learner.Learner.backward>`); per minibatch: clip the
gradients and step. How the rows of a micro-batch are run (side by side on a multi-core CPU) and how
gradients meet across ranks (DDP/FSDP) sit behind
:meth:`Learner.accumulate <ppo_lm.trainer.learner.Learner.accumulate>`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import Tensor

from ..algorithms import ObjectiveSettings, StatsAggregator, UpdateStats, loss_units, ppo_objective
from ..config.train import OptimConfig, TrainConfig
from ..models import sharding
from ..models.actor_critic import packs_sequences
from ..models.hf_compat import checkpointing_on
from ..rollout.score.batch import RolloutBatch, agreed_length_groups, select_rows
from ..runtime import distributed as dist
from ..runtime.errors import UserError
from ..runtime.memory import release_free_memory
from .learner import Learner


class UpdateResult(NamedTuple):
    """What one update did. ``stats``: over every applied minibatch step and rank (means, and the
    maximum for ``ratio_max``); ``lr_*``: the learning rate the last step used (the critic's None
    without a critic); ``skipped``: minibatch steps skipped for a non-finite loss or gradient norm;
    ``nonfinite_in_row``: skips since the last applied step, the ones carried in included."""

    stats: UpdateStats
    lr_actor: float
    lr_critic: float | None
    skipped: int
    nonfinite_in_row: int


class NonFiniteLossError(UserError, RuntimeError):
    """Too many consecutive updates had a non-finite loss or gradient."""


@dataclass(frozen=True)
class UpdateBatch:
    """The update's data (docs/algorithm.md §1.4): a rollout's sequences and stored log-probs and values, with
    the advantages Â and critic targets R̂ of steps 2–3. Shapes as :class:`RolloutBatch`;
    advantages (B, T); values_old, returns (B, T), or None without a critic; action_mask (B, T) or None
    (single-turn), as in :class:`RolloutBatch`; is_weights (B, T) an off-policy correction's weights on
    the policy loss (``algo.off_policy_correction``), or None."""

    input_ids: Tensor
    attention_mask: Tensor
    prompt_width: int
    response_mask: Tensor
    logp_old: Tensor
    logp_ref: Tensor
    advantages: Tensor
    values_old: Tensor | None = None
    returns: Tensor | None = None
    action_mask: Tensor | None = None
    is_weights: Tensor | None = None

    @property
    def size(self) -> int:
        return self.input_ids.shape[0]

    @property
    def loss_mask(self) -> Tensor:
        return self.response_mask if self.action_mask is None else self.action_mask

    @classmethod
    def of(cls, rollout: RolloutBatch, advantages: Tensor, returns: Tensor | None, is_weights: Tensor | None = None
           ) -> UpdateBatch:
        """What step 4 trains on: ``rollout`` with the advantages and returns of steps 2–3 (and an
        off-policy correction's weights, if any)."""
        return cls(input_ids=rollout.input_ids, attention_mask=rollout.attention_mask, prompt_width=rollout.prompt_width,
                   response_mask=rollout.response_mask, logp_old=rollout.logp_old, logp_ref=rollout.logp_ref,
                   advantages=advantages, values_old=rollout.values_old, returns=returns,
                   action_mask=rollout.action_mask, is_weights=is_weights)

    def select(self, idx: Tensor, *, trim: bool = True) -> UpdateBatch:
        """Rows ``idx`` (see :func:`~ppo_lm.rollout.score.batch.select_rows`)."""
        return select_rows(self, idx, trim)



class RowsResult(NamedTuple):
    """What a forward/backward over some rows gives the minibatch's statistics."""

    finite: bool
    stats: UpdateStats
    units: float  # what the losses are means over (tokens, or responses for the seq-mean modes)
    tokens: float


def objective_settings(cfg: TrainConfig, kl_coef: float) -> ObjectiveSettings:
    """The objective's coefficients from the run's (resolved) config; ``kl_coef``: β of a KL loss term."""
    a = cfg.algo
    return ObjectiveSettings(
        policy_loss=a.policy_loss, clip_eps=a.clip_eps, clip_eps_high=a.clip_eps_high, dual_clip=a.dual_clip,
        kl_coef=kl_coef, kl_estimator=a.kl_estimator, kl_clamp=a.kl_clamp, entropy_coef=a.entropy_coef,
        vf_coef=cfg.critic.vf_coef, value_clip_eps=cfg.critic.value_clip_eps, loss_agg=a.loss_agg,
        horizon=float(cfg.rollout.max_new_tokens),
    )


def micro_batches(mb_idx: Tensor, batch: UpdateBatch, size: int, *, packed: bool = False) -> list[Tensor]:
    """The minibatch's rows as length-sorted micro-batches, so each forward/backward is cut to its own
    longest response and the update's cost follows the real lengths. ``size`` > 0: micro-batches of
    that many rows; 0: the whole minibatch when the models pack sequences (``packed``: packing
    removes the padding, and does it best over many rows), else one or a few micro-batches, whichever
    saves enough padding (``length_groups``). Every rank runs as many micro-batches.

    The loss is normalised by the minibatch's global count, so the gradient does not depend on the
    grouping.
    """
    if packed and not size:
        return [mb_idx]
    lengths = batch.response_mask[mb_idx].sum(1)
    return [mb_idx[g] for g, _ in agreed_length_groups(lengths, size, prompt_width=batch.prompt_width)]


def minibatch_count(mask: Tensor, loss_agg: str) -> float:
    """What each rank divides its summed losses by: the minibatch's loss units over all its
    micro-batches and ranks, ÷ world (DDP and FSDP average the ranks' gradients)."""
    units = dist.all_reduce_sum(torch.tensor(loss_units(mask, loss_agg), dtype=torch.float64))
    return max(float(units), 1.0) / dist.world_size()


def values_source(learner: Learner, batch: UpdateBatch) -> str | None:
    """Which model gives the update's values: "policy" (a shared critic's value head), "critic" (a
    separate critic), or None (a critic-free estimator, no values in the batch)."""
    if batch.values_old is None or not learner.critic_params:
        return None
    return "policy" if learner.policy.value_head is not None else "critic"


def forward_backward(learner: Learner, mb: UpdateBatch, objective: ObjectiveSettings, count: float, *,
                     train_policy: bool, values_from: str | None, temperature: float,
                     with_entropy: bool) -> RowsResult:
    """Forward, objective and backward on the rows ``mb`` of a minibatch: the policy's (with a shared
    critic's value loss, ``values_from`` "policy"), then a separate critic's (``values_from``
    "critic") — one after the other, so the policy's activations are freed before the critic's
    forward. Each loss is the rows' sum over loss units ÷ ``count`` (:func:`minibatch_count`), so the
    gradients summed over every call of the minibatch are exactly the whole minibatch's."""
    m, P = mb.loss_mask, mb.prompt_width
    finite, stats = True, UpdateStats()
    if train_policy or values_from == "policy":
        out = learner.policy_fwd(
            mb.input_ids, mb.attention_mask, P, temperature=temperature,
            with_entropy=with_entropy and train_policy, entropy_grad=objective.entropy_coef > 0,
            with_values=values_from == "policy",
        )
        policy_terms = dict(logp=out["logp"], logp_old=mb.logp_old, advantages=mb.advantages, logp_ref=mb.logp_ref,
                            entropy=out.get("entropy"), weights=mb.is_weights) if train_policy else {}
        value_terms = dict(values=out["values"][:, :-1], values_old=mb.values_old,
                           returns=mb.returns) if values_from == "policy" else {}
        loss, stats = ppo_objective(m, objective, **policy_terms, **value_terms)
        finite = bool(torch.isfinite(loss))
        learner.backward(loss / count, learner.policy_grad_params)
    if values_from == "critic":
        values = learner.critic_fwd(mb.input_ids, mb.attention_mask, P)
        loss, critic_stats = ppo_objective(m, objective, values=values[:, :-1], values_old=mb.values_old,
                                           returns=mb.returns)
        finite = finite and bool(torch.isfinite(loss))
        learner.backward(loss / count, learner.critic_params)
        stats.value_loss, stats.value_clip_frac = critic_stats.value_loss, critic_stats.value_clip_frac
    return RowsResult(finite, stats, loss_units(m, objective.loss_agg), float(m.sum()))


def clip_and_step(learner: Learner, o: OptimConfig, finite: bool, *, train_policy: bool,
                  train_critic: bool) -> tuple[bool, UpdateStats]:
    """Step 4b: clip the gradients and step the optimisers — unless a loss or gradient norm is
    non-finite on any rank; then zero the gradients. Returns whether the step was applied and the
    gradient norms (of the all-reduced gradients, so every rank sees the same ones; a finite loss can
    still have a non-finite gradient, which clipping would spread to every weight)."""
    finite = bool(dist.all_reduce_sum(torch.tensor(0.0 if finite else 1.0)) == 0)
    norms = UpdateStats()
    if finite:
        if train_policy:
            norms.grad_norm_actor = sharding.clip_grad_norm(learner.actor_params, o.max_grad_norm)
        if train_critic:
            norms.grad_norm_critic = sharding.clip_grad_norm(learner.critic_params, o.max_grad_norm)
        finite = all(math.isfinite(v) for _, v in norms.items())
    if finite:
        if train_policy:
            learner.actor_opt.step()
        if train_critic:
            learner.critic_opt.step()
    learner.zero_grad()
    return finite, norms


def minibatch_gradients(learner: Learner, batch: UpdateBatch, mb_idx: Tensor, objective: ObjectiveSettings,
                        cfg: TrainConfig, lengths: Tensor, *, packed: bool, train_policy: bool,
                        values_from: str | None, first_epoch: bool) -> tuple[StatsAggregator, bool]:
    """Step 4a for the minibatch ``mb_idx`` (its row indices): forward, objective and backward micro-batch
    by micro-batch, the gradients summed into ``.grad`` (and met across ranks on the last micro-batch).
    Returns the minibatch's statistics and whether every loss was finite on this rank. ``lengths`` (B,)
    the rows' response lengths."""
    a = cfg.algo
    count = minibatch_count(batch.loss_mask[mb_idx], a.loss_agg)
    micro = micro_batches(mb_idx, batch, cfg.optim.micro_batch_size, packed=packed)

    def rows_forward_backward(rows: Tensor) -> RowsResult:
        return forward_backward(learner, batch.select(rows), objective, count, train_policy=train_policy,
                                values_from=values_from, temperature=cfg.rollout.temperature or 1.0,
                                with_entropy=a.entropy_coef > 0 or first_epoch)  # a diagnostic: epoch 1

    stats, finite = StatsAggregator(), True
    for j, rows in enumerate(micro):
        for r in learner.accumulate(rows_forward_backward, rows, lengths[rows], batch.prompt_width,
                                    sync=j == len(micro) - 1):
            # A non-finite loss still ran backward, so every rank took part in the same gradient
            # all-reduces; the minibatch's gradient is discarded in 4b.
            finite = finite and r.finite
            stats.add(r.stats, units=r.units, tokens=r.tokens)
    return stats, finite


def ppo_update(
    learner: Learner,
    batch: UpdateBatch,
    cfg: TrainConfig,
    shuffle_gen: torch.Generator,
    *,
    train_policy: bool = True,
    kl_coef: float = 0.0,
    nonfinite_in_row: int = 0,
    iteration: int = 0,
) -> UpdateResult:
    """Optimise the clipped surrogate and the value loss on a fixed rollout.

    Each minibatch's loss is normalised by its token (or sequence) count over all micro-batches and
    ranks, so accumulation and data parallelism give exactly the full-minibatch gradient. A
    minibatch whose loss or gradient norm is non-finite on any rank is skipped on all of them.
    ``train_policy`` False: critic warm-up. ``kl_coef``: β of the KL loss term (``algo.kl_in`` =
    loss; the KL controller's current value), 0 for none. ``nonfinite_in_row``: skipped minibatch
    steps that ended the previous update, continued here; ``optim.max_nonfinite_in_row`` of them in a
    row stop the run (:class:`NonFiniteLossError`, naming ``iteration``).
    """
    o = cfg.optim
    B = batch.size
    mb_size = B // o.num_minibatches
    lengths = batch.response_mask.sum(1)
    objective = objective_settings(cfg, kl_coef)
    values_from = values_source(learner, batch)
    train_critic = values_from is not None and learner.critic_opt is not None
    packed = packs_sequences(learner.policy) and (learner.critic is None or packs_sequences(learner.critic))
    stats, skipped, in_row, max_in_row = StatsAggregator(), 0, nonfinite_in_row, nonfinite_in_row
    # the rates the last applied steps used (the schedules move only when a step is applied)
    lr_actor = learner.actor_opt.param_groups[0]["lr"]
    lr_critic = learner.critic_opt.param_groups[0]["lr"] if learner.critic_opt is not None else None

    if learner.release_memory:
        release_free_memory()  # sampling's and scoring's freed temporaries: not resident during the update
    # the policy's and the critic's passes over the rollout (critic.epochs); past the shorter
    # count, the epochs train one model alone and skip the other's forward
    actor_epochs = o.epochs if train_policy else 0
    critic_epochs = (cfg.critic.epochs or o.epochs) if train_critic else 0
    with checkpointing_on(learner.policy, learner.critic):  # (a no-op unless a model checkpoints)
        for epoch in range(max(actor_epochs, critic_epochs)):
            policy_now, critic_now = epoch < actor_epochs, epoch < critic_epochs
            perm = torch.randperm(B, generator=shuffle_gen).to(batch.input_ids.device)
            for k in range(o.num_minibatches):
                mb_idx = perm[k * mb_size : (k + 1) * mb_size]

                # 4a. Forward, objective and backward, micro-batch by micro-batch, into .grad.
                mb_stats, finite = minibatch_gradients(learner, batch, mb_idx, objective, cfg, lengths, packed=packed,
                                                       train_policy=policy_now,
                                                       values_from=values_from if critic_now else None,
                                                       first_epoch=epoch == 0)

                # 4b. Clip and step — or skip the minibatch on every rank (it leaves no statistics).
                applied, norms = clip_and_step(learner, o, finite, train_policy=policy_now,
                                               train_critic=critic_now)
                if not applied:
                    skipped, in_row = skipped + 1, in_row + 1
                    max_in_row = max(max_in_row, in_row)
                    continue
                in_row = 0
                stats.merge(mb_stats)
                stats.add(norms)

                # 4c. Each schedule counts its own optimiser's steps (the actor's skip the critic
                # warm-up); the logged rates are those the steps used, read before the schedules move.
                if policy_now:
                    lr_actor = learner.actor_opt.param_groups[0]["lr"]
                    learner.actor_sched.step()
                if critic_now:
                    lr_critic = learner.critic_opt.param_groups[0]["lr"]
                    learner.critic_sched.step()
    if max_in_row >= o.max_nonfinite_in_row:
        raise NonFiniteLossError(
            f"{max_in_row} consecutive minibatch updates had a non-finite loss or gradient (iteration {iteration}; "
            f"`optim.max_nonfinite_in_row`={o.max_nonfinite_in_row}): lower the learning rates or check the reward scale")
    return UpdateResult(stats.result(all_reduce_sum=dist.all_reduce_sum, all_reduce_max=dist.all_reduce_max),
                        lr_actor, lr_critic, skipped, in_row)
