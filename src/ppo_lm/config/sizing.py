"""The settings whose right value depends on the model being trained, resolved from its size.

A learning rate that trains the 0.14 M-parameter built-in model in minutes (3e-4) moves a pretrained
135 M-parameter instruct model 25 nats per response away from where it started in one iteration, and a
response limit of 8 tokens cuts every answer of such a model short. So ``optim.actor_lr``,
``critic.lr``, ``rollout.max_new_tokens``, ``algo.bootstrap_truncated`` and ``critic.kind`` default to ``"auto"``,
which :func:`resolve_auto` resolves from the policy's parameter count once it is loaded: a model below
:data:`LARGE_MODEL_PARAMETERS` takes :data:`SMALL` (the values the built-in task was tuned with), a
larger one :data:`LARGE` (verl's actor rate, ten times it with LoRA adapters, which start from zero; a
critic at 1e-4 whose cut responses end their returns at their score, the setting under which the
critic learned on SmolLM2-135M: docs/critic.md), and one of :data:`BILLION_PARAMETERS` or more
:data:`BILLION` (LARGE with verl's and OpenRLHF's critic rate of 1e-5 for models of that size); a run
with an environment (``rollout.env``) takes the separate critic at any size (config/critics.py). The
run's banner prints what was resolved and why; config.yaml keeps ``"auto"``, so a file reused on
another model resolves for that one. An ``auto`` ``optim.micro_batch_size`` is resolved once the
prompts are read (:func:`resolve_micro_batch`): whole minibatches, except LoRA on a large model, whose
update runs micro-batches sized from an estimate of their activations against the memory of the
models and their state. The rules and their measurements: docs/training.md, "Defaults that depend on the model".
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..algorithms import get_advantage_estimator
from . import critics
from .train import TrainConfig

LARGE_MODEL_PARAMETERS = 10_000_000
"""Policies with at least this many parameters (embeddings included) take :data:`LARGE`."""
BILLION_PARAMETERS = critics.LARGE_CRITIC_PARAMETERS
"""Policies with at least this many parameters take :data:`BILLION`."""
CRITIC_SETTINGS = ("critic.kind", "critic.lr", "algo.bootstrap_truncated")
"""Resolved for every run, listed in the banner only where the estimator has a critic."""


@dataclass(frozen=True)
class SizeProfile:
    """The resolved values of the ``auto`` settings for one size class of model."""

    name: str
    actor_lr: float
    actor_lr_lora: float
    critic_lr: float
    max_new_tokens: int
    bootstrap_truncated: bool
    """Whether a response cut by the limit bootstraps from V (``algo.bootstrap_truncated``). A pretrained
    model's early responses run into the limit and the reward scores them as they stand; there a
    bootstrapped critic chased its own value on SmolLM2 (docs/critic.md "Truncated responses"), while on
    the built-in task, where the limit cuts almost no response, the bootstrap measured better (the same
    section)."""


SMALL = SizeProfile("small", actor_lr=3e-4, actor_lr_lora=1e-3, critic_lr=1e-3, max_new_tokens=8,
                    bootstrap_truncated=True)
LARGE = SizeProfile("large", actor_lr=1e-6, actor_lr_lora=1e-5, critic_lr=1e-4, max_new_tokens=128,
                    bootstrap_truncated=False)
BILLION = dataclasses.replace(LARGE, name="billion-scale", critic_lr=1e-5)


def profile_for(parameters: int) -> SizeProfile:
    """The size class of a policy with ``parameters`` parameters."""
    if parameters >= BILLION_PARAMETERS:
        return BILLION
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
    values: dict[str, float | int | bool]
    """The dotted names of the settings that were ``auto`` and the values they took."""
    reason: str
    """Why, in words: the policy's size and the class it falls in."""
    parameters: int = 0
    """The policy's parameter count the sizes were resolved for (before any adapters)."""


def resolve_auto(cfg: TrainConfig, parameters: int, context: int | None = None) -> Resolved:
    """``cfg`` with each ``auto`` of ``optim.actor_lr``, ``critic.lr``, ``rollout.max_new_tokens``,
    ``algo.bootstrap_truncated`` and ``critic.kind`` replaced by the value of the policy's size class
    (:func:`profile_for`; ``critic.kind`` by :func:`~ppo_lm.config.critics.resolve_auto`); ``context``: the
    policy's max_position_embeddings, which an ``auto`` response limit leaves at least half of to the
    prompt, and never below ``rollout.min_new_tokens``. The critic's settings are listed in ``values``
    only where the estimator has a critic."""
    p = profile_for(parameters)
    o, r, a = cfg.optim, cfg.rollout, cfg.algo
    resolved: dict[str, float | int | bool] = {}
    if o.actor_lr == "auto":
        resolved["optim.actor_lr"] = p.actor_lr_lora if cfg.model.lora_r else p.actor_lr
    if cfg.critic.lr == "auto":
        resolved["critic.lr"] = p.critic_lr
    if r.max_new_tokens == "auto":
        limit = p.max_new_tokens if context is None else min(p.max_new_tokens, max(context // 2, 1))
        resolved["rollout.max_new_tokens"] = max(limit, r.min_new_tokens)
    if a.bootstrap_truncated == "auto":
        resolved["algo.bootstrap_truncated"] = p.bootstrap_truncated
    if cfg.critic.kind == "auto":
        resolved["critic.kind"] = critics.resolve_auto(parameters, cfg.rollout.episodic).name
    optim = dataclasses.replace(o, actor_lr=resolved.get("optim.actor_lr", o.actor_lr))
    rollout = dataclasses.replace(r, max_new_tokens=resolved.get("rollout.max_new_tokens", r.max_new_tokens))
    algo = dataclasses.replace(a, bootstrap_truncated=resolved.get("algo.bootstrap_truncated", a.bootstrap_truncated))
    critic = get_advantage_estimator(a.estimator).needs_critic
    values = {k: v for k, v in resolved.items() if critic or k not in CRITIC_SETTINGS}
    size = f"{parameters / 1e6:.2f} M" if parameters < 1e9 else f"{parameters / 1e9:.2f} B"
    bound = BILLION_PARAMETERS if p is BILLION else LARGE_MODEL_PARAMETERS
    bound_text = f"{bound / 1e9:g} B" if bound >= 1e9 else f"{bound / 1e6:g} M"
    reason = f"policy of {size} parameters, {'<' if p is SMALL else '≥'} {bound_text}: {p.name} model"
    by_size = critics.resolve_auto(parameters, env=False)
    if critic and cfg.critic.kind == "auto" and resolved["critic.kind"] != by_size.name:  # the environment chose it
        reason += f"; {critics.AUTO_ENV.name} critic: an environment's episodes"
    critic_section = dataclasses.replace(cfg.critic, kind=resolved.get("critic.kind", cfg.critic.kind),
                                         lr=resolved.get("critic.lr", cfg.critic.lr))
    return Resolved(dataclasses.replace(cfg, optim=optim, rollout=rollout, algo=algo, critic=critic_section), values,
                    reason, parameters)


ACTIVATION_SHARE = 1 / 3
"""With ``optim.micro_batch_size`` auto, a LoRA run of a large model keeps the estimated activations of
one micro-batch within this share of the memory its models and their training state take
(:func:`state_bytes`). LoRA's state is mostly the frozen weights, and there a whole minibatch's
activations set the peak (docs/benchmarks.md "Defaults behind measurements" has W3's figures). Full
fine-tuning's peak is its state (weights, gradients, AdamW's moments, which outweigh W3's activations),
so it keeps whole minibatches."""

SAVED_HIDDEN_PER_LAYER = 9
SAVED_INTERMEDIATE_PER_LAYER = 3
"""What the update's forward keeps for the backward per token and layer of a llama-style body, in
hidden-wide and intermediate-wide vectors: the norms' inputs, the projections' inputs, attention's q,
k, v and output (k and v at full width: an upper bound where grouped-query attention keeps them
narrower); the MLP's gate and up (kept by the SwiGLU kernel) and the down
projection's input. Measured on SmolLM2 (H 576, I 1536) by walking autograd's saved tensors
with k and v expanded: ≈ 9.7 k floats against 9 H + 3 I = 9.8 k."""


def activation_bytes_per_token(model_config, dtype_bytes: int = 4) -> int:
    """Estimated bytes one token's forward keeps for the backward, over all layers of a body with
    ``model_config`` (a transformers config: llama/qwen2/gpt-2 names; the MLP width defaults to 4 H)."""
    c = model_config
    hidden = getattr(c, "hidden_size", None) or getattr(c, "n_embd", 0)
    layers = getattr(c, "num_hidden_layers", None) or getattr(c, "n_layer", 0)
    inner = getattr(c, "intermediate_size", None) or getattr(c, "n_inner", None) or 4 * hidden
    return layers * (SAVED_HIDDEN_PER_LAYER * hidden + SAVED_INTERMEDIATE_PER_LAYER * inner) * dtype_bytes


def state_bytes(models, trained) -> int:
    """Bytes of the models' parameters (each storage once: a LoRA reference or critic that shares a
    body counts it once) plus, per trained parameter, its gradient and AdamW's two fp32 moments."""
    storages = {p.untyped_storage().data_ptr(): p.untyped_storage().nbytes()
                for m in models if m is not None for p in m.parameters()}
    return sum(storages.values()) + sum(p.numel() * (p.element_size() + 8) for p in trained)


def resolve_micro_batch(resolved: Resolved, *, minibatch_rows: int, tokens_per_row: int,
                        bytes_per_token: int, state: int) -> Resolved:
    """``resolved`` with an ``auto`` ``optim.micro_batch_size`` resolved: 0 (the whole minibatch of
    ``minibatch_rows`` rows) for full fine-tuning, a small policy, or where ``minibatch_rows`` rows of
    ``tokens_per_row`` tokens keep their estimated activations (``bytes_per_token`` each, the larger of
    the policy's and a separate critic's) within :data:`ACTIVATION_SHARE` of ``state`` bytes; else the
    largest divisor of ``minibatch_rows`` that does (at least 1)."""
    cfg = resolved.cfg
    if cfg.optim.micro_batch_size != "auto":
        return resolved
    large = profile_for(resolved.parameters) is not SMALL and bool(cfg.model.lora_r)
    per_row = max(tokens_per_row * bytes_per_token, 1)
    fit = int(ACTIVATION_SHARE * state // per_row)
    rows = 0
    if large and fit < minibatch_rows:
        rows = max(d for d in range(1, max(fit, 1) + 1) if minibatch_rows % d == 0)
    values, reason = dict(resolved.values), resolved.reason
    values["optim.micro_batch_size"] = rows
    if large:
        mib = 2**20
        reason += (f"; {minibatch_rows}-row minibatches ≈ {minibatch_rows * per_row / mib:.0f} MiB of activations "
                   f"against {ACTIVATION_SHARE * state / mib:.0f} MiB, a third of the models and their state (LoRA)")
    optim = dataclasses.replace(cfg.optim, micro_batch_size=rows)
    return Resolved(dataclasses.replace(cfg, optim=optim), values, reason, resolved.parameters)


def size_micro_batches(resolved: Resolved, *, minibatch_rows: int, tokens_per_row: int, bodies, models,
                       dtype_bytes: int) -> Resolved:
    """:func:`resolve_micro_batch` for a run's own models: the activations of the widest of ``bodies``
    (the policy's language model, a separate critic's), the state of ``models`` (all the run holds;
    their parameters that require grad are the trained ones)."""
    per_token = max(activation_bytes_per_token(b.config, dtype_bytes) for b in bodies)
    trained = {id(p): p for m in models if m is not None for p in m.parameters() if p.requires_grad}
    return resolve_micro_batch(resolved, minibatch_rows=minibatch_rows, tokens_per_row=tokens_per_row,
                               bytes_per_token=per_token, state=state_bytes(models, list(trained.values())))
