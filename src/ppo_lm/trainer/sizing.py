"""The settings whose right value depends on the model being trained, resolved from its size.

A learning rate that trains the 0.14 M-parameter built-in model in minutes (3e-4) moves a pretrained
135 M-parameter instruct model 25 nats per response away from where it started in one iteration, and a
response limit of 8 tokens cuts every answer of such a model short. So ``optim.actor_lr``,
``optim.critic_lr`` and ``rollout.max_new_tokens`` default to ``"auto"``, which :func:`resolve_auto`
resolves from the policy's parameter count once it is loaded: a model below
:data:`LARGE_MODEL_PARAMETERS` takes :data:`SMALL` (the values the built-in task was tuned with), any
larger one :data:`LARGE` (verl's actor and critic rates for pretrained models; ten times the actor rate
with LoRA adapters, which start from zero). The run's banner prints what was resolved and why;
config.yaml keeps ``"auto"``, so a file reused on another model resolves for that one. The rules and
their measurements: README "Defaults that depend on the model".
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from .config import TrainConfig

LARGE_MODEL_PARAMETERS = 10_000_000
"""Policies with at least this many parameters (embeddings included) take :data:`LARGE`."""


@dataclass(frozen=True)
class SizeProfile:
    """The resolved values of the ``auto`` settings for one size class of model."""

    name: str
    actor_lr: float
    actor_lr_lora: float
    critic_lr: float
    max_new_tokens: int


SMALL = SizeProfile("small", actor_lr=3e-4, actor_lr_lora=1e-3, critic_lr=1e-3, max_new_tokens=8)
LARGE = SizeProfile("large", actor_lr=1e-6, actor_lr_lora=1e-5, critic_lr=1e-5, max_new_tokens=128)


def profile_for(parameters: int) -> SizeProfile:
    """The size class of a policy with ``parameters`` parameters."""
    return LARGE if parameters >= LARGE_MODEL_PARAMETERS else SMALL


def builtin_max_new_tokens(cfg: TrainConfig) -> int:
    """The response limit the built-in model is built for before its size is known (its context is
    sized from it): an ``auto`` limit resolves to :data:`SMALL`'s for any built-in model of the
    sizes it is meant to be used at."""
    m = cfg.rollout.max_new_tokens
    return SMALL.max_new_tokens if m == "auto" else m


@dataclass(frozen=True)
class Resolved:
    """A config with its ``auto`` sizes resolved, and what was resolved, for the banner."""

    cfg: TrainConfig
    values: dict[str, float | int]
    """The dotted names of the settings that were ``auto`` and the values they took."""
    reason: str
    """Why, in words: the policy's size and the class it falls in."""


def resolve_auto(cfg: TrainConfig, parameters: int, context: int | None = None) -> Resolved:
    """``cfg`` with each ``auto`` of ``optim.actor_lr``, ``optim.critic_lr`` and ``rollout.max_new_tokens``
    replaced by the value of the policy's size class (:func:`profile_for`); ``context``: the policy's
    max_position_embeddings, which an ``auto`` response limit leaves at least half of to the prompt, and
    never below ``rollout.min_new_tokens``."""
    p = profile_for(parameters)
    o, r = cfg.optim, cfg.rollout
    values: dict[str, float | int] = {}
    if o.actor_lr == "auto":
        values["optim.actor_lr"] = p.actor_lr_lora if cfg.model.lora_r else p.actor_lr
    if o.critic_lr == "auto":
        values["optim.critic_lr"] = p.critic_lr
    if r.max_new_tokens == "auto":
        limit = p.max_new_tokens if context is None else min(p.max_new_tokens, max(context // 2, 1))
        values["rollout.max_new_tokens"] = max(limit, r.min_new_tokens)
    optim = dataclasses.replace(o, actor_lr=values.get("optim.actor_lr", o.actor_lr),
                                critic_lr=values.get("optim.critic_lr", o.critic_lr))
    rollout = dataclasses.replace(r, max_new_tokens=values.get("rollout.max_new_tokens", r.max_new_tokens))
    size = f"{parameters / 1e6:.2f} M" if parameters < 1e9 else f"{parameters / 1e9:.2f} B"
    bound = f"{LARGE_MODEL_PARAMETERS / 1e6:g} M"
    reason = f"policy of {size} parameters, {'≥' if p is LARGE else '<'} {bound}: {p.name} model"
    return Resolved(dataclasses.replace(cfg, optim=optim, rollout=rollout), values, reason)
