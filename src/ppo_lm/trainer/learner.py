"""What the update trains with: the trained models (and the modules whose forward it calls), their
parameters, optimisers and learning-rate schedules (:mod:`ppo_lm.runtime.optim`), and the one
backward call the update makes (:meth:`Learner.backward`), with CPU lanes and data-parallel gradient
accumulation as strategies behind :meth:`Learner.accumulate`."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

import torch
from torch import Tensor, nn

from ..config.train import TrainConfig
from ..models import sharding
from ..models.actor_critic import CriticModel, PolicyModel
from ..models.hf_compat import hidden_size, is_checkpointed
from ..runtime import distributed as dist
from ..runtime import optim
from ..runtime.lanes import Lanes, lanes_for
from ..runtime.memory import release_pays

T = TypeVar("T")


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
    release_memory: bool = False  # give freed memory back before each update (runtime.memory.release_pays)

    @property
    def policy_grad_params(self) -> list[nn.Parameter]:
        """Every trainable parameter of the policy module (its value head included)."""
        return [p for p in self.policy.parameters() if p.requires_grad]

    def backward(self, loss: Tensor, params: Sequence[nn.Parameter]) -> None:
        """Back-propagate ``loss`` into the ``.grad`` of ``params``: ``loss.backward()`` (on a CPU lane
        beside others, into that lane's own gradients, summed when :meth:`accumulate` returns)."""
        self.lanes.backward(loss, params)

    def accumulate(self, fn: Callable[[Tensor], T], rows: Tensor, lengths: Tensor, prompt_width: int, *,
                   sync: bool) -> list[T]:
        """``fn(rows)`` — forwards and :meth:`backward` calls over some rows of a minibatch — adding the
        gradients into ``.grad``. On CPU the rows may run as shares side by side (one result per share,
        :meth:`Lanes.accumulate`); under DDP gradients meet across ranks only when ``sync`` (the
        minibatch's last micro-batch), so accumulation all-reduces once."""
        sync_ctx = contextlib.nullcontext() if sync else sharding.no_sync(self.policy_fwd, self.critic_fwd)
        with sync_ctx:
            return self.lanes.accumulate(fn, rows, lengths, prompt_width)

    def zero_grad(self) -> None:
        self.actor_opt.zero_grad(set_to_none=True)
        if self.critic_opt is not None:
            self.critic_opt.zero_grad(set_to_none=True)


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
    adam = dict(weight_decay=o.weight_decay, betas=tuple(o.adam_betas), eps=o.adam_eps, fused=not fsdp)
    actor_opt = optim.adamw(actor_params, o.actor_lr, **adam)
    critic_opt = optim.adamw(critic_params, cfg.critic.lr, **adam) if critic_params else None
    total = cfg.iterations * (cfg.critic.epochs or o.epochs) * o.num_minibatches
    actor_total = max(cfg.iterations - cfg.critic.warmup_iterations, 1) * o.epochs * o.num_minibatches
    return Learner(
        policy, critic, policy_fwd, critic_fwd, actor_params, critic_params, actor_opt, critic_opt,
        optim.lr_schedule(actor_opt, o.schedule, o.warmup_steps, actor_total),
        optim.lr_schedule(critic_opt, o.schedule, o.warmup_steps, total) if critic_opt else None,
        lanes_for(cfg.model.cpu_lanes, device, dist.is_initialized(), policy, critic, hidden=hidden_size(policy.lm),
                  checkpointed=is_checkpointed(policy, critic)),
        release_memory=device.type == "cpu" and release_pays(policy, critic),
    )
