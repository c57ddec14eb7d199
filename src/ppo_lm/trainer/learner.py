"""What the update trains with: the trained models (and the modules whose forward it calls), their
parameters, optimisers and learning-rate schedules, and how forwards over rows are run."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ..models import sharding
from ..models.actor_critic import CriticModel, PolicyModel
from ..models.hf_compat import hidden_size, is_checkpointed
from ..runtime import distributed as dist
from ..runtime.lanes import Lanes, lanes_for
from .config import TrainConfig


def _scheduler(name: str, opt: torch.optim.Optimizer, warmup: int, total: int):
    from transformers import get_scheduler

    kind = {"constant": "constant_with_warmup", "cosine": "cosine", "linear": "linear"}[name]
    kwargs = {"num_warmup_steps": warmup}
    if kind != "constant_with_warmup":
        kwargs["num_training_steps"] = total
    return get_scheduler(kind, opt, **kwargs)


def _adamw(params: list[nn.Parameter], lr: float, adam: dict, *, fused: bool) -> torch.optim.Optimizer:
    """AdamW, fused into one kernel where torch has it for these parameters (CPU since torch 2.4,
    CUDA): the same update rule in one pass over the parameters instead of many small ops; the sums
    round differently (≈ 1e-7 relative)."""
    if fused:
        try:
            return torch.optim.AdamW(params, lr=lr, fused=True, **adam)
        except (RuntimeError, ValueError):
            pass  # e.g. a device or dtype without a fused kernel
    return torch.optim.AdamW(params, lr=lr, **adam)


@dataclass
class Learner:
    """The update's models and optimisers. ``policy_fwd``/``critic_fwd`` run the forwards (the module
    itself, or its data-parallel wrapper); ``actor_params`` are the policy's language-model weights,
    ``critic_params`` the value head's (shared critic) or the separate critic's."""

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
    lanes: Lanes

    @property
    def policy_grad_params(self) -> list[nn.Parameter]:
        """Every trainable parameter of the policy module (its value head included)."""
        return [p for p in self.policy.parameters() if p.requires_grad]


def build_learner(cfg: TrainConfig, policy: PolicyModel, critic: CriticModel | None, device: torch.device) -> Learner:
    o = cfg.optim
    fsdp = cfg.model.fsdp and dist.is_initialized()
    # before the optimisers exist: sharding replaces the parameters
    policy_fwd, critic_fwd = sharding.prepare_for_training(policy, critic, fsdp=fsdp, bf16=cfg.model.fsdp_bf16,
                                                           device=device)
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
    return Learner(
        policy, critic, policy_fwd, critic_fwd, actor_params, critic_params, actor_opt, critic_opt,
        _scheduler(o.schedule, actor_opt, o.warmup_steps, actor_total),
        _scheduler(o.schedule, critic_opt, o.warmup_steps, total) if critic_opt else None,
        lanes_for(cfg.model.cpu_lanes, device, dist.is_initialized(), policy, critic, hidden=hidden_size(policy.lm),
                  checkpointed=is_checkpointed(policy, critic)),
    )
