"""Which model files and verifiers a config names: read from the settings alone, before anything loads."""

from __future__ import annotations

from pathlib import Path

from ..runtime.errors import ConfigError
from ..tasks import reasoning_gym
from .train import TrainConfig

BUILTIN_REWARD = "builtin:equations"


def is_model_path(spec: str) -> bool:
    return not spec.startswith("builtin") and ":" not in spec.replace("\\", "/").split("/")[-1] and (
        Path(spec).exists() or "/" in spec
    )


def reward_spec(cfg: TrainConfig) -> str:
    """``model.reward`` with ``auto`` resolved: the task's own verifier — the equation verifier for the
    built-in prompts, the task's scorer (``reasoning-gym``) for a reasoning-gym task's — or a
    :class:`ConfigError` for prompts of your own, whose reward only you can name."""
    if cfg.model.reward != "auto":
        return cfg.model.reward
    if cfg.data.prompts == "builtin:equations":
        return BUILTIN_REWARD
    if reasoning_gym.task_of(cfg.data.prompts) is not None:
        return reasoning_gym.REWARD
    raise ConfigError(f"`model.reward` is 'auto', which names a reward for the built-in prompts and reasoning-gym tasks "
                      f"only; `data.prompts` is {cfg.data.prompts!r}: name its reward (a verifier 'file.py:function' or "
                      "'module:function', or a reward model's directory)")


def reward_specs(cfg: TrainConfig) -> list[tuple[str, float]]:
    """``model.reward`` (``auto`` resolved: :func:`reward_spec`) split at commas, each with its weight
    (``model.reward_weights``, default 1); none for an ``auto`` reward beside an environment, whose turn
    rewards replace it."""
    if cfg.model.reward == "auto" and cfg.rollout.episodic:
        return []
    reward = reward_spec(cfg)
    specs = [s.strip() for s in reward.split(",")]
    if not all(specs):
        raise ConfigError(f"`model.reward`={reward!r} has an empty entry; separate rewards by single commas")
    weights = list(cfg.model.reward_weights) or [1.0] * len(specs)
    if len(weights) != len(specs):
        raise ConfigError(f"`model.reward_weights` has {len(weights)} weights for {len(specs)} rewards "
                          f"({', '.join(specs)}); give one per reward, in order")
    return list(zip(specs, weights))
