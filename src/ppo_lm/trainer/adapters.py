"""LoRA in a run (``model.lora_r`` > 0, docs/lora.md): adapters on the policy and a separate critic, the
reference as the policy with its adapters off, and frozen bodies shared instead of copied — a critic's
frozen body too (``critic.lora_r``, ``critic.kind`` frozen; docs/critic.md)."""

from __future__ import annotations

import dataclasses

from torch import nn

from ..config import critics
from ..config.train import ModelConfig, TrainConfig
from ..models import lora
from ..models.actor_critic import AdaptersOff, CriticModel, PolicyModel
from ..models.hf_compat import scalar_head, trunk
from ..runtime.errors import ConfigError
from . import roles


def lora_settings(m: ModelConfig, r: int | None = None) -> lora.LoraSettings | None:
    """The run's LoRA settings at rank ``r`` (None: ``model.lora_r``), or None when that rank is 0."""
    r = m.lora_r if r is None else r
    if not r:
        return None
    return lora.LoraSettings(r=r, alpha=m.lora_alpha, dropout=m.lora_dropout,
                             target_modules=tuple(m.lora_target_modules), head=m.lora_head)


def _add(model: nn.Module, cfg: TrainConfig, name_or_path: str | None, *, head: bool, r: int | None = None) -> None:
    settings = dataclasses.replace(lora_settings(cfg.model, r), head=head)
    try:
        lora.add_adapters(model, settings, seed=cfg.seed, name_or_path=name_or_path)
    except ValueError as e:
        raise ConfigError(str(e)) from None


def add_policy_adapters(cfg: TrainConfig, policy: PolicyModel) -> None:
    """LoRA on the policy's language model (its LM head too with ``model.lora_head``); a shared critic's
    value head keeps training in full."""
    base = None if cfg.model.policy == "builtin" else cfg.model.policy
    _add(policy.lm, cfg, base, head=cfg.model.lora_head)


def build_reference(policy: PolicyModel) -> PolicyModel | AdaptersOff:
    """The frozen reference π_ref: with LoRA, the policy run with its adapters off (one copy of the
    weights); otherwise :func:`roles.frozen_copy` of ``policy.lm`` (the policy's weights as they start)."""
    if lora.has_adapters(policy.lm):
        return AdaptersOff(policy)
    return PolicyModel(roles.frozen_copy(policy.lm))


def freeze_critic_body(cfg: TrainConfig, critic: CriticModel, ref: nn.Module, reward_model: nn.Module | None) -> None:
    """A separate critic whose body does not train (its kind's ``body_frozen``): LoRA adapters on it at
    its kind's ``adapter_rank``, or none for a frozen critic; its value head trains in full either
    way. The body it started from (``critic.init``) is frozen on both sides, so the critic holds
    those weights by reference, not as a copy: the reward model's, or the policy's as it started —
    the frozen reference ``ref`` (the policy's own base weights with LoRA), so in full fine-tuning the
    critic adds no second body to memory."""
    source = cfg.critic.init
    if source == "auto":
        source = "reward" if reward_model is not None else "policy"
    donor = {"reward": reward_model, "policy": ref.lm}.get(source)
    critic.model.requires_grad_(False)
    if donor is not None:
        share_weights(trunk(critic.model), trunk(donor))
    rank = critics.settings_kind(cfg).adapter_rank(cfg)
    if rank:
        _add(critic.model, cfg, None, head=False, r=rank)
    scalar_head(critic.model).requires_grad_(True)


def share_weights(target: nn.Module, source: nn.Module) -> None:
    """Make ``target``'s parameters and buffers the very tensors of ``source`` where they are equal
    (same names, shapes and values): one copy in memory. For bodies that neither side trains."""
    src = dict(source.named_parameters(remove_duplicate=False)) | dict(source.named_buffers())
    src = {k.replace(".base_layer.", "."): v for k, v in src.items()}  # a LoRA donor's frozen base layers
    for name, p in list(target.named_parameters(remove_duplicate=False)) + list(target.named_buffers()):
        s = src.get(name)
        if s is None or s.shape != p.shape or s.dtype != p.dtype or s.device != p.device or not s.data.equal(p.data):
            continue
        p.data = s.data
