"""Start-up checks of a TrainConfig: fail in the first second with the field name and the fix."""

from __future__ import annotations

import dataclasses
import math
from functools import partial

from ..algorithms import check_positive, check_unit_interval, get_advantage_estimator
from ..runtime.errors import ConfigError
from .config import AlgoConfig, TrainConfig
from .config_io import check_types

TRACKERS = ("tensorboard", "wandb", "mlflow", "trackio")

_unit = partial(check_unit_interval, error=ConfigError)
_pos = partial(check_positive, error=ConfigError)


def _check_builtin(cfg: TrainConfig) -> None:
    """The built-in model's settings (the built-in prompt set's are checked where it is loaded: rows
    passed from Python do not use them)."""
    m = cfg.model
    if m.policy == "builtin":
        for name, v in [("model.builtin_hidden_size", m.builtin_hidden_size), ("model.builtin_layers", m.builtin_layers),
                        ("model.builtin_heads", m.builtin_heads)]:
            if v < 1:
                raise ConfigError(f"`{name}` must be >= 1, got {v}")
        if m.builtin_hidden_size % (2 * m.builtin_heads):
            raise ConfigError(
                f"`model.builtin_hidden_size`={m.builtin_hidden_size} must be a multiple of 2 × "
                f"`model.builtin_heads` ({2 * m.builtin_heads}): each head's width is split in halves by RoPE"
            )


def _check_lora(cfg: TrainConfig) -> None:
    m = cfg.model
    if m.lora_r < 0:
        raise ConfigError(f"`model.lora_r` must be >= 0 (0 = no LoRA), got {m.lora_r}")
    if not m.lora_r:
        if m.lora_head:
            raise ConfigError("`model.lora_head` needs `model.lora_r` > 0 (the rank of the adapters)")
        return
    _pos("model.lora_alpha", m.lora_alpha)
    if not 0 <= m.lora_dropout < 1:
        raise ConfigError(f"`model.lora_dropout` must lie in [0, 1), got {m.lora_dropout}")
    targets = m.lora_target_modules
    if not targets or any(not isinstance(t, str) or not t.strip() for t in targets):
        raise ConfigError("`model.lora_target_modules` must name at least one module (e.g. q_proj,v_proj) or be "
                          f"all-linear, got {targets!r}")
    if "all-linear" in targets and len(targets) > 1:
        raise ConfigError(f"`model.lora_target_modules`: 'all-linear' already names every linear layer; give it "
                          f"alone or list module names, got {targets!r}")
    import importlib.util

    if importlib.util.find_spec("peft") is None:
        raise ConfigError("`model.lora_r` > 0 needs the peft package: pip install 'ppo-lm[lora]'")


def validate_config(cfg: TrainConfig, world_size: int = 1) -> None:
    """Raise :class:`ConfigError` naming the first bad field."""
    check_types(cfg)
    r, a, o, log = cfg.rollout, cfg.algo, cfg.optim, cfg.log
    if cfg.iterations < 1:
        raise ConfigError(f"`iterations` must be >= 1, got {cfg.iterations}")
    for name, v in [("rollout.num_prompts", r.num_prompts), ("rollout.samples_per_prompt", r.samples_per_prompt),
                    ("rollout.max_new_tokens", r.max_new_tokens), ("optim.epochs", o.epochs),
                    ("optim.num_minibatches", o.num_minibatches)]:
        if v < 1:
            raise ConfigError(f"`{name}` must be >= 1, got {v}")
    _pos("rollout.temperature", r.temperature)
    if not math.isfinite(r.temperature):  # inf would sample uniformly, whatever the policy
        raise ConfigError(f"`rollout.temperature` must be finite, got {r.temperature}")
    _unit("rollout.top_p", r.top_p, open_low=True)
    _pos("rollout.top_k", r.top_k, allow_zero=True)
    _pos("rollout.forward_batch_size", r.forward_batch_size, allow_zero=True)
    _pos("rollout.min_new_tokens", r.min_new_tokens, allow_zero=True)
    _unit("algo.gamma", a.gamma)
    _unit("algo.gae_lambda", a.gae_lambda)
    _unit("algo.critic_lambda", a.critic_lambda)
    _pos("algo.adaptive_lambda_alpha", a.adaptive_lambda_alpha)
    _pos("algo.kl_coef", a.kl_coef, allow_zero=True)
    _pos("algo.kl_clamp", a.kl_clamp)
    _pos("algo.adaptive_kl_target", a.adaptive_kl_target)
    _pos("algo.adaptive_kl_horizon", a.adaptive_kl_horizon)
    if a.adaptive_kl_target is not None:
        if a.kl_coef <= 0:
            raise ConfigError("`algo.kl_coef` must be > 0 with `algo.adaptive_kl_target`: the adaptive β starts "
                              "from it and scales it, so 0 would stay 0")
        episodes = r.num_prompts * r.samples_per_prompt
        if a.adaptive_kl_horizon < episodes:
            # β ← β·(1 + e·n/horizon) with |e| ≤ 0.2: n > horizon moves β by over 20 % an iteration, and
            # n > 5·horizon makes it negative.
            raise ConfigError(
                f"`algo.adaptive_kl_horizon`={a.adaptive_kl_horizon} is below the episodes per iteration "
                f"({episodes}): β would move by more than 20 % an iteration (and turn negative beyond 5×); "
                f"use a horizon >= {episodes} (Ziegler et al. 2019 use 10000)"
            )
    _pos("algo.clip_eps", a.clip_eps)
    _pos("algo.clip_eps_high", a.clip_eps_high)
    _pos("algo.value_clip_eps", a.value_clip_eps)
    _pos("algo.vf_coef", a.vf_coef, allow_zero=True)
    _pos("algo.entropy_coef", a.entropy_coef, allow_zero=True)
    if a.dual_clip is not None and not a.dual_clip > 1:
        raise ConfigError(f"`algo.dual_clip` must be > 1 (or null to disable), got {a.dual_clip}")
    for name, v in [("optim.actor_lr", o.actor_lr), ("optim.critic_lr", o.critic_lr),
                    ("optim.max_grad_norm", o.max_grad_norm), ("optim.adam_eps", o.adam_eps)]:
        _pos(name, v)
    _pos("optim.weight_decay", o.weight_decay, allow_zero=True)
    for i, b in enumerate(o.adam_betas):
        if not 0 <= b < 1:
            raise ConfigError(f"`optim.adam_betas[{i}]` must lie in [0, 1), got {b}")
    if o.max_nonfinite_in_row < 1:
        raise ConfigError(f"`optim.max_nonfinite_in_row` must be >= 1, got {o.max_nonfinite_in_row}")
    weights = list(cfg.model.reward_weights)
    if not all(math.isfinite(w) for w in weights):  # one NaN/inf weight makes every score non-finite
        raise ConfigError(f"`model.reward_weights` must be finite, got {weights}")
    if not 0 <= cfg.model.value_grad_scale <= 1:
        raise ConfigError(f"`model.value_grad_scale` must lie in [0, 1], got {cfg.model.value_grad_scale}")
    _check_lora(cfg)
    unknown = [x for x in log.report_to if x not in TRACKERS]
    if unknown:
        raise ConfigError(f"`log.report_to`: unknown tracker(s) {unknown}; choose from {', '.join(TRACKERS)}")
    if log.eval_samples < 1:
        raise ConfigError(f"`log.eval_samples` must be >= 1, got {log.eval_samples}")
    if cfg.data.builtin_eval_prompts < 1:
        raise ConfigError(f"`data.builtin_eval_prompts` must be >= 1, got {cfg.data.builtin_eval_prompts}")
    if log.keep_last < 1:
        raise ConfigError(f"`log.keep_last` must be >= 1, got {log.keep_last}")
    for name, v in [("threads", cfg.threads), ("model.cpu_lanes", cfg.model.cpu_lanes), ("log.save_every", log.save_every), ("log.print_every", log.print_every), ("log.eval_every", log.eval_every),
                    ("optim.warmup_steps", o.warmup_steps), ("optim.critic_warmup_iterations", o.critic_warmup_iterations)]:
        if v < 0:
            raise ConfigError(f"`{name}` must be >= 0, got {v}")
    if r.min_new_tokens > r.max_new_tokens:
        raise ConfigError(f"`rollout.min_new_tokens`={r.min_new_tokens} exceeds `rollout.max_new_tokens`="
                          f"{r.max_new_tokens}")
    _check_builtin(cfg)

    spec = get_advantage_estimator(a.estimator)
    if a.kl_in == "reward" and a.kl_coef > 0 and not spec.uses_shaped_rewards:
        raise ConfigError(
            f"`algo.kl_in`='reward' would have no effect: `algo.estimator`={a.estimator!r} builds its "
            "advantages from the scores alone (docs/algorithm.md §3); set `algo.kl_in` to 'loss' (or 'auto'), or "
            "`algo.kl_coef` to 0 (to resume a run written before this check, which ran without a KL: "
            "`--algo.kl-coef 0`)"
        )
    if spec.needs_groups and r.samples_per_prompt < 2:
        raise ConfigError(
            f"`algo.estimator`={a.estimator!r} compares samples of the same prompt: set "
            f"`rollout.samples_per_prompt` >= 2 (got {r.samples_per_prompt})"
        )
    if r.num_prompts % world_size:
        raise ConfigError(
            f"`rollout.num_prompts`={r.num_prompts} must be divisible by the number of processes ({world_size})"
        )
    local = r.num_prompts // world_size * r.samples_per_prompt
    if local % o.num_minibatches:
        raise ConfigError(
            f"`optim.num_minibatches`={o.num_minibatches} must divide the episodes per process "
            f"(rollout.num_prompts/world_size × samples_per_prompt = {local})"
        )
    mb = local // o.num_minibatches
    if o.micro_batch_size < 0 or (o.micro_batch_size and mb % o.micro_batch_size):
        raise ConfigError(
            f"`optim.micro_batch_size`={o.micro_batch_size} must divide the minibatch size per process "
            f"({mb}); use 0 for no gradient accumulation"
        )


def resolve_algo(a: AlgoConfig) -> AlgoConfig:
    """``a`` with its ``auto`` choices made for its estimator (see :class:`AlgoConfig`): where the KL
    goes, its estimator, the loss aggregation. The trainer runs on the result; the run's config.yaml
    keeps ``auto``, so a config reused with another estimator resolves for that one."""
    spec = get_advantage_estimator(a.estimator)
    kl_in = a.kl_in if a.kl_in != "auto" else ("reward" if spec.uses_shaped_rewards else "loss")
    kl_estimator = a.kl_estimator if a.kl_estimator != "auto" else ("k1" if kl_in == "reward" else "k3")
    loss_agg = a.loss_agg if a.loss_agg != "auto" else spec.loss_agg
    return dataclasses.replace(a, kl_in=kl_in, kl_estimator=kl_estimator, loss_agg=loss_agg)


def effective_algo(a: AlgoConfig) -> AlgoConfig:
    """:func:`resolve_algo`, with every way of having no KL term written one way (β = 0, or — as runs
    written before the check above did — a KL in the reward of an estimator that ignores it), so
    that a resumed run is compared with its original by what it computes."""
    r = resolve_algo(a)
    if r.kl_coef == 0 or (r.kl_in == "reward" and not get_advantage_estimator(r.estimator).uses_shaped_rewards):
        r = dataclasses.replace(r, kl_coef=0.0, kl_in="loss", kl_estimator="k3")
    return r
