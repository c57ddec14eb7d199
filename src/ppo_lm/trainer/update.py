"""Step 4 of the loop (SPEC §1.4): K epochs × minibatches × micro-batches of PPO updates."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import torch
from torch import Tensor, nn

from .. import distributed as dist
from ..lanes import Lanes, resolve_lanes
from ..models.actor_critic import CriticModel, PolicyModel, packs_sequences
from ..models.hf_compat import hidden_size, is_dropout_rate
from ..rollout.batch import RolloutBatch, length_groups
from .config import TrainConfig
from .step import MAX_STATS, Step, accumulate, lane_rows, merge_shares, rows_step, stat_weight


def _scheduler(name: str, opt: torch.optim.Optimizer, warmup: int, total: int):
    from transformers import get_scheduler

    kind = {"constant": "constant_with_warmup", "cosine": "cosine", "linear": "linear"}[name]
    kwargs = {"num_warmup_steps": warmup}
    if kind != "constant_with_warmup":
        kwargs["num_training_steps"] = total
    return get_scheduler(kind, opt, **kwargs)


def _checkpointed(*models: nn.Module | None) -> bool:
    """Gradient checkpointing on any trained model: (reentrant) checkpointing does not support the
    ``autograd.grad`` the lanes back-propagate with, so the update keeps one lane."""
    return any(vars(m).get("gradient_checkpointing") is True for model in models if model is not None
               for m in model.modules())


@contextlib.contextmanager
def _checkpointing_on(*models: nn.Module | None):
    """transformers checkpoints a layer's activations only when that layer is in training mode, and
    the trained models sit in eval mode (:func:`~ppo_lm.models.hf_compat.disable_dropout`). For the
    update, put only the modules that carry the checkpointing switch in training mode — their
    sub-modules (attention, MLP, dropout) stay in eval mode — and zero the dropout rates that some
    layers read from the model config at forward time; everything is put back afterwards."""
    modes, rates = [], []
    for model in (m for m in models if m is not None and _checkpointed(m)):
        for sub in model.modules():
            if vars(sub).get("gradient_checkpointing") is True:
                modes.append((sub, sub.training))
            config = vars(sub).get("config")
            if config is not None and all(c is not config for c, _, _ in rates):
                rates += [(config, k, v) for k, v in vars(config).items() if is_dropout_rate(k, v) and v != 0.0]
    for sub, _ in modes:
        sub.training = True
    for config, k, _ in rates:
        setattr(config, k, 0.0)
    try:
        yield
    finally:
        for sub, training in modes:
            sub.training = training
        for config, k, v in rates:
            setattr(config, k, v)


def _adamw(params: list[nn.Parameter], lr: float, adam: dict, *, fused: bool) -> torch.optim.Optimizer:
    """AdamW, fused into one kernel where torch has it for these parameters (CPU since torch 2.4,
    CUDA): W1's 4.5 M-parameter step takes 2 ms instead of 14 ms with the multi-tensor version.
    Same update rule; the sums round differently (≈ 1e-7 relative)."""
    if fused:
        try:
            return torch.optim.AdamW(params, lr=lr, fused=True, **adam)
        except (RuntimeError, ValueError):
            pass  # e.g. a device or dtype without a fused kernel
    return torch.optim.AdamW(params, lr=lr, **adam)


@dataclass
class UpdateContext:
    """Models, optimisers and schedules of the update. ``policy_fwd``/``critic_fwd`` are what runs the
    forward (the module itself, or its DistributedDataParallel wrapper)."""

    cfg: TrainConfig
    policy: PolicyModel
    critic: CriticModel | None
    policy_fwd: nn.Module
    critic_fwd: nn.Module | None
    actor_params: list[nn.Parameter]
    critic_params: list[nn.Parameter]
    actor_opt: torch.optim.Optimizer
    critic_opt: torch.optim.Optimizer | None
    actor_sched: object
    critic_sched: object | None
    lanes: Lanes  # shares each micro-batch's rows among threads on CPU

    @property
    def policy_grad_params(self) -> list[nn.Parameter]:
        """Every trainable parameter of the policy module (its value head included)."""
        return [p for p in self.policy.parameters() if p.requires_grad]

    @classmethod
    def build(cls, cfg: TrainConfig, policy: PolicyModel, critic: CriticModel | None, device) -> UpdateContext:
        o = cfg.optim
        fsdp = cfg.model.fsdp and dist.is_initialized()
        if fsdp:  # before the optimisers exist: sharding replaces the parameters
            from ..models.sharding import shard

            shard(policy, policy.lm, bf16=cfg.model.fsdp_bf16)
            if critic is not None:
                shard(critic, critic.model, bf16=cfg.model.fsdp_bf16)
        actor_params = [p for p in policy.lm.parameters() if p.requires_grad]
        critic_params: list[nn.Parameter] = []
        if policy.value_head is not None:
            critic_params = list(policy.value_head.parameters())
        elif critic is not None:
            critic_params = [p for p in critic.parameters() if p.requires_grad]
        adam = dict(betas=tuple(o.adam_betas), eps=o.adam_eps, weight_decay=o.weight_decay)
        actor_opt = _adamw(actor_params, o.actor_lr, adam, fused=not fsdp)
        critic_opt = _adamw(critic_params, o.critic_lr, adam, fused=not fsdp) if critic_params else None
        steps_per_iteration = o.epochs * o.num_minibatches
        total = cfg.iterations * steps_per_iteration
        actor_total = max(cfg.iterations - o.critic_warmup_iterations, 1) * steps_per_iteration
        policy_fwd, critic_fwd = policy, critic
        if dist.is_initialized() and not fsdp:
            from torch.nn.parallel import DistributedDataParallel as DDP

            ids = [device.index] if device.type == "cuda" else None
            policy_fwd = DDP(policy, device_ids=ids, find_unused_parameters=policy.value_head is not None)
            critic_fwd = DDP(critic, device_ids=ids) if critic is not None else None
        return cls(
            cfg, policy, critic, policy_fwd, critic_fwd, actor_params, critic_params, actor_opt, critic_opt,
            _scheduler(o.schedule, actor_opt, o.warmup_steps, actor_total),
            _scheduler(o.schedule, critic_opt, o.warmup_steps, total) if critic_opt else None,
            Lanes(1 if _checkpointed(policy, critic) else resolve_lanes(cfg.model.cpu_lanes, device, dist.is_initialized())),
        )


class _Stats:
    """The update's statistics over all its micro-batches, minibatches, epochs and ranks: means weighted
    by :func:`~.step.stat_weight` (losses by their units, the rest by tokens), except :data:`MAX_STATS`
    (``ratio_max``), whose value is the maximum over all of them."""

    def __init__(self):
        self.sums: dict[str, float] = {}
        self.weights: dict[str, float] = {}
        self.maxima: dict[str, float] = {}

    def add(self, stats: dict[str, Tensor | float], weight: float, tokens: float | None = None) -> None:
        """``tokens`` None: every statistic counts ``weight`` (per-step values such as grad norms)."""
        for k, v in stats.items():
            if k in MAX_STATS:
                self.maxima[k] = max(self.maxima.get(k, -math.inf), float(v))
                continue
            w = weight if tokens is None else stat_weight(k, weight, tokens)
            self.sums[k] = self.sums.get(k, 0.0) + float(v) * w
            self.weights[k] = self.weights.get(k, 0.0) + w

    def result(self) -> dict[str, float]:
        out: dict[str, float] = {}
        keys = sorted(self.sums)
        if keys:
            t = dist.all_reduce_sum(torch.tensor([[self.sums[k], self.weights[k]] for k in keys], dtype=torch.float64))
            out.update({k: float(s / w) if w else float("nan") for k, (s, w) in zip(keys, t.tolist())})
        # Every rank reduces the same keys (a rank whose losses were all non-finite has none of its own).
        t = dist.all_reduce_max(torch.tensor([self.maxima.get(k, -math.inf) for k in MAX_STATS], dtype=torch.float64))
        out.update({k: v for k, v in zip(MAX_STATS, t.tolist()) if v > -math.inf})
        return out


def _no_sync(ctx: UpdateContext, *, skip: bool):
    """DDP's no_sync for every wrapped model when ``skip`` (gradient accumulation), else a no-op."""
    stack = contextlib.ExitStack()
    if skip:
        for m in (ctx.policy_fwd, ctx.critic_fwd):
            if m is not None and hasattr(m, "no_sync"):
                stack.enter_context(m.no_sync())
    return stack


def _grad_norm_and_clip(params: list[nn.Parameter], max_norm: float) -> float:
    if not params:
        return 0.0
    norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
    return float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)  # DTensor under FSDP


def _micro_batches(mb_idx: Tensor, batch: RolloutBatch, size: int, *, packed: bool = False) -> list[Tensor]:
    """The minibatch's rows as length-sorted micro-batches, so each forward/backward is cut to its own
    longest response and the update's cost follows the real lengths. ``size`` > 0: micro-batches of
    that many rows; 0: the whole minibatch when the models pack sequences (``packed``: packing
    removes the padding, and does it best over many rows), else one or a few micro-batches, whichever
    saves enough padding (``length_groups``).

    The loss is normalised by the minibatch's global count, so the gradient does not depend on the
    grouping. Every rank runs the same number of micro-batches: DDP's forward and FSDP's all-gathers
    are collectives.
    """
    if packed and not size:
        return [mb_idx]
    lengths = batch.response_mask[mb_idx].sum(1)
    groups = length_groups(lengths, size, prompt_width=batch.prompt_width)
    if not size and dist.world_size() > 1:
        k = int(dist.all_reduce_max(torch.tensor(len(groups))))
        if k != len(groups):
            groups = length_groups(lengths, num_groups=k, prompt_width=batch.prompt_width)
    return [mb_idx[g] for g, _ in groups]


def ppo_update(
    ctx: UpdateContext,
    batch: RolloutBatch,
    policy_loss_fn: Callable[..., tuple[Tensor, dict[str, Tensor]]],
    shuffle_gen: torch.Generator,
    *,
    train_policy: bool = True,
    kl_coef: float = 0.0,
    nonfinite_in_row: int = 0,
) -> dict[str, float]:
    """Optimise the clipped surrogate and the value loss on a fixed rollout.

    Each minibatch's loss is normalised by its token (or sequence) count over all micro-batches and
    ranks, so accumulation and data parallelism give exactly the full-minibatch gradient. ``kl_coef``:
    β of the KL loss term (``algo.kl_in`` = loss; the KL controller's current value), 0 for none.
    ``nonfinite_in_row``: skipped minibatch updates that ended the previous update, continued here.
    Returns the stats over all minibatches (means; ``ratio_max`` the maximum) plus ``nonfinite_skipped``
    (minibatch updates skipped: a non-finite loss or gradient norm), ``nonfinite_in_row`` (skips since
    the last applied one, counting ``nonfinite_in_row`` in) and ``nonfinite_max_in_row`` (the longest
    such run during this update).
    """
    cfg, a, o = ctx.cfg, ctx.cfg.algo, ctx.cfg.optim
    world = dist.world_size()
    B = batch.size
    mb_size = B // o.num_minibatches
    horizon = float(cfg.rollout.max_new_tokens)
    temperature = cfg.rollout.temperature or 1.0
    has_critic = batch.values_old is not None and ctx.critic_params
    ent_grad = a.entropy_coef > 0
    stats, skipped, in_row, max_in_row = _Stats(), 0, nonfinite_in_row, nonfinite_in_row
    used_lr: dict[str, float] = {}
    P = batch.prompt_width
    packed = packs_sequences(ctx.policy) and (ctx.critic is None or packs_sequences(ctx.critic))
    shared_values = ctx.policy.value_head is not None and bool(has_critic)
    separate_values = ctx.policy.value_head is None and bool(has_critic)
    hidden = hidden_size(ctx.policy.lm)

    with _checkpointing_on(ctx.policy, ctx.critic):  # (a no-op unless a model checkpoints)
        for epoch in range(o.epochs):
            perm = torch.randperm(B, generator=shuffle_gen).to(batch.input_ids.device)
            for k in range(o.num_minibatches):
                mb_idx = perm[k * mb_size : (k + 1) * mb_size]
                mb_mask = batch.response_mask[mb_idx]
                if a.loss_agg == "token-mean":
                    count = dist.all_reduce_sum(mb_mask.sum().double())
                else:
                    count = dist.all_reduce_sum(torch.tensor(float(mb_idx.numel()), dtype=torch.float64))
                # DDP averages gradients over ranks, so each rank divides by count/world.
                denom = count / world
                finite, mb_stats = True, []
                micro_batches = _micro_batches(mb_idx, batch, o.micro_batch_size, packed=packed)
                for j, micro_idx in enumerate(micro_batches):
                    # On CPU the micro-batch's rows are shared among lanes (threads) that run at once, each
                    # returning its gradients; summed, they are the micro-batch's gradient.
                    shares = lane_rows(micro_idx, batch, ctx.lanes, hidden)
                    st = Step(P, temperature, policy_loss_fn, dict(agg=a.loss_agg, denominator=denom, horizon=horizon),
                               train_policy, shared_values, separate_values,
                               want_entropy=ent_grad or epoch == 0,  # the entropy diagnostic: first epoch only
                               own_grads=len(shares) > 1, kl_coef=kl_coef)
                    # Gradients are all-reduced once per minibatch, on its last micro-batch.
                    with _no_sync(ctx, skip=j < len(micro_batches) - 1):
                        results = ctx.lanes.run([partial(rows_step, ctx, batch.select(rows), st) for rows in shares])
                    accumulate(ctx.policy_grad_params, [r.policy_grads for r in results])
                    accumulate(ctx.critic_params, [r.critic_grads for r in results])
                    # A non-finite loss still ran backward, so every rank took part in the same gradient
                    # all-reduces; the whole minibatch's gradient is then discarded below.
                    loss_finite = all(r.finite for r in results)
                    finite = finite and loss_finite
                    mb_stats.append(merge_shares([(r.stats, r.weight, r.tokens) for r in results]))
                finite = bool(dist.all_reduce_sum(torch.tensor(0.0 if finite else 1.0)) == 0)
                norms = {}
                if finite:
                    # The norms are of the all-reduced gradients, so every rank sees the same ones. A finite
                    # loss can still have a non-finite gradient; clipping would spread it to every weight.
                    if train_policy:
                        norms["grad_norm_actor"] = _grad_norm_and_clip(ctx.actor_params, o.max_grad_norm)
                    if ctx.critic_opt is not None and has_critic:
                        norms["grad_norm_critic"] = _grad_norm_and_clip(ctx.critic_params, o.max_grad_norm)
                    finite = math.isfinite(sum(norms.values()))
                if finite:
                    if train_policy:
                        ctx.actor_opt.step()
                    if "grad_norm_critic" in norms:
                        ctx.critic_opt.step()
                ctx.actor_opt.zero_grad(set_to_none=True)
                if ctx.critic_opt:
                    ctx.critic_opt.zero_grad(set_to_none=True)
                if not finite:
                    # A skipped minibatch leaves no statistics (it changed nothing); the decision is the same
                    # on every rank, so are the keys of the statistics the ranks reduce at the end.
                    skipped += 1
                    in_row += 1
                    max_in_row = max(max_in_row, in_row)
                    continue
                in_row = 0
                for step_stats, weight, tokens in mb_stats:
                    stats.add(step_stats, weight, tokens)
                stats.add(norms, 1.0)
                # Each schedule counts its own optimiser's steps (the actor's skip the critic warm-up); the
                # logged rates are those the iteration's last steps used, read before the schedules move on.
                if train_policy:
                    used_lr["lr_actor"] = ctx.actor_opt.param_groups[0]["lr"]
                    ctx.actor_sched.step()
                if ctx.critic_sched is not None and has_critic:
                    used_lr["lr_critic"] = ctx.critic_opt.param_groups[0]["lr"]
                    ctx.critic_sched.step()
    result = stats.result()
    result["lr_actor"] = used_lr.get("lr_actor", ctx.actor_opt.param_groups[0]["lr"])
    if ctx.critic_opt is not None:
        result["lr_critic"] = used_lr.get("lr_critic", ctx.critic_opt.param_groups[0]["lr"])
    result["nonfinite_skipped"] = float(skipped)
    result["nonfinite_in_row"], result["nonfinite_max_in_row"] = float(in_row), float(max_in_row)
    return result

