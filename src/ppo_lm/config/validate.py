"""Start-up checks of a TrainConfig: fail in the first second with the field name and the fix."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import Any

from ..algorithms import get_advantage_estimator
from ..algorithms.off_policy import OFF_POLICY_CORRECTIONS
from ..runtime.errors import ConfigError
from ..runtime.settings import check_ranges
from ..tasks import reasoning_gym
from .critics import settings_kind
from .io import check_types
from .train import AlgoConfig, TrainConfig
from .unused import Facts, check_unused

TRACKERS = ("tensorboard", "wandb", "mlflow", "trackio")

def _check_builtin(cfg: TrainConfig) -> None:
    """The built-in model's shape: its hidden size splits over its heads (the sizes themselves are
    their fields' ranges)."""
    m = cfg.model
    if m.policy == "builtin" and m.builtin_hidden_size % (2 * m.builtin_heads):
        raise ConfigError(
            f"`model.builtin_hidden_size`={m.builtin_hidden_size} must be a multiple of 2 × "
            f"`model.builtin_heads` ({2 * m.builtin_heads}): each head's width is split in halves by RoPE"
        )


def _check_lora(cfg: TrainConfig) -> None:
    m = cfg.model
    kind = settings_kind(cfg)
    if cfg.critic.lora_r and kind.own_body and "critic.lora_r" not in kind.settings:  # a frozen one
        raise ConfigError(f"`critic.lora_r`={cfg.critic.lora_r} with `critic.kind`={kind.name!r}: a {kind.name} "
                          f"critic trains {kind.trains(cfg)} alone; set `critic.kind` to 'separate' for a LoRA "
                          "critic, or leave `critic.lora_r` out")
    if m.lora_head and not m.lora_r:
        raise ConfigError("`model.lora_head` needs `model.lora_r` > 0 (the rank of the adapters)")
    if not m.lora_r and not kind.adapter_rank(cfg):
        return
    targets = m.lora_target_modules
    if not targets or any(not isinstance(t, str) or not t.strip() for t in targets):
        raise ConfigError("`model.lora_target_modules` must name at least one module (e.g. q_proj,v_proj) or be "
                          f"all-linear, got {targets!r}")
    if "all-linear" in targets and len(targets) > 1:
        raise ConfigError(f"`model.lora_target_modules`: 'all-linear' already names every linear layer; give it "
                          f"alone or list module names, got {targets!r}")
    import importlib.util

    if importlib.util.find_spec("peft") is None:
        field = "model.lora_r" if m.lora_r else "critic.lora_r"
        raise ConfigError(f"`{field}` > 0 needs the peft package: pip install 'ppo-lm[lora]'")


def _check_adaptive_kl(cfg: TrainConfig) -> None:
    a, r = cfg.algo, cfg.rollout
    if a.adaptive_kl_target is None:
        return
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


def _check_estimator(cfg: TrainConfig) -> None:
    a, r = cfg.algo, cfg.rollout
    spec = get_advantage_estimator(a.estimator)
    if a.kl_in == "reward" and a.kl_coef > 0 and not spec.uses_shaped_rewards:
        raise ConfigError(
            f"`algo.kl_in`='reward' would have no effect: `algo.estimator`={a.estimator!r} builds its "
            "advantages from the scores alone (docs/algorithm.md §3); set `algo.kl_in` to 'loss' (or 'auto'), or "
            "`algo.kl_coef` to 0 (to resume a run written before this check, which ran without a KL: "
            "`--algo.kl-coef 0`)"
        )
    # the critic's settings with a critic-free estimator: config/unused.py, with every unused setting
    if spec.needs_groups and r.samples_per_prompt < 2:
        raise ConfigError(
            f"`algo.estimator`={a.estimator!r} compares samples of the same prompt: set "
            f"`rollout.samples_per_prompt` >= 2 (got {r.samples_per_prompt})"
        )


def _check_batch_division(cfg: TrainConfig, world_size: int) -> None:
    r, o = cfg.rollout, cfg.optim
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
    if o.micro_batch_size != "auto" and o.micro_batch_size and mb % o.micro_batch_size:
        raise ConfigError(
            f"`optim.micro_batch_size`={o.micro_batch_size} must divide the minibatch size per process "
            f"({mb}); use 0 for no gradient accumulation"
        )


def validate_config(cfg: TrainConfig, world_size: int = 1, *, keep: Mapping[str, Any] | None = None) -> None:
    """Raise :class:`ConfigError` naming the first bad field: its type, the range its field declares
    (config/train.py), then the rules that tie several fields together, then a setting this run would
    ignore (config/unused.py; those that involve a file wait for the start-up checks, which read it).
    ``keep``: a resumed run's own settings (its flattened config.yaml), not refused as unused again."""
    check_types(cfg)
    check_ranges(cfg, error=ConfigError)
    r = cfg.rollout
    if r.max_new_tokens != "auto" and r.min_new_tokens > r.max_new_tokens:  # auto resolves to ≥ min
        raise ConfigError(f"`rollout.min_new_tokens`={r.min_new_tokens} exceeds `rollout.max_new_tokens`="
                          f"{r.max_new_tokens}")
    unknown = [x for x in cfg.log.report_to if x not in TRACKERS]
    if unknown:
        raise ConfigError(f"`log.report_to`: unknown tracker(s) {unknown}; choose from {', '.join(TRACKERS)}")
    _check_adaptive_kl(cfg)
    _check_lora(cfg)
    _check_builtin(cfg)
    try:
        reasoning_gym.check_answer_mode(cfg.data.task_answer)
    except reasoning_gym.TaskError as e:
        raise ConfigError(str(e)) from None
    _check_estimator(cfg)
    _check_batch_division(cfg, world_size)
    _check_async(cfg)
    r = cfg.rollout
    if r.agent is not None and r.env is not None:
        raise ConfigError("`rollout.agent` and `rollout.env` both set: an episode is played by an agent (through the "
                          "OpenAI client) or by an environment; keep one")
    if r.agent is not None and r.max_staleness:
        raise ConfigError(f"`rollout.agent` with `rollout.max_staleness`={r.max_staleness}: an agent's episodes are "
                          "sampled in the learner's process; set `rollout.max_staleness` 0")
    if r.env_sessions and r.env_sessions < r.samples_per_prompt:
        raise ConfigError(f"`rollout.env_sessions`={r.env_sessions} is below `rollout.samples_per_prompt` "
                          f"({r.samples_per_prompt}): a group's episodes play together; allow at least "
                          f"{r.samples_per_prompt}, or 0 for the whole batch")
    check_unused(cfg, Facts(torchrun=True if world_size > 1 else None), keep)


def _check_async(cfg: TrainConfig) -> None:
    k = cfg.rollout.max_staleness
    if not k:
        return
    if cfg.algo.off_policy_correction is None:
        raise ConfigError(f"`rollout.max_staleness`={k} samples with weights up to {k} updates old: choose how the "
                          "policy loss corrects for that with `algo.off_policy_correction` — tis is the one "
                          f"measured best (docs/async.md); also {', '.join(n for n in OFF_POLICY_CORRECTIONS if n != 'tis')}, "
                          "or 'none' to leave it uncorrected (docs/algorithm.md §1.6) — or set "
                          "`rollout.max_staleness` 0")
    if cfg.rollout.logp_from_sampler:
        raise ConfigError(f"`rollout.logp_from_sampler` with `rollout.max_staleness`={k}: logp_old must be the "
                          "learner's own (the policy the update clips against); leave `rollout.logp_from_sampler` out")
    if cfg.model.fsdp:
        raise ConfigError(f"`rollout.max_staleness`={k} with `model.fsdp`: the producer keeps a whole copy of the "
                          "policy, which a sharded run does not hold; use DDP, or set `rollout.max_staleness` 0")
    folder = cfg.rollout.weight_box_dir
    if folder is not None and not (os.path.isdir(folder) and os.access(folder, os.W_OK)):
        raise ConfigError(f"`rollout.weight_box_dir`={folder!r} is not a folder this process can write: create it, "
                          "or leave `rollout.weight_box_dir` out (the weights then go through anonymous memory)")


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
