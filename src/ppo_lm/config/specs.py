"""Which model files and verifiers a config names: read from the settings alone, before anything loads."""

from __future__ import annotations

from pathlib import Path

from ..runtime.errors import ConfigError
from .train import ModelConfig


def is_model_path(spec: str) -> bool:
    return not spec.startswith("builtin") and ":" not in spec.replace("\\", "/").split("/")[-1] and (
        Path(spec).exists() or "/" in spec
    )


def reward_specs(cfg: ModelConfig) -> list[tuple[str, float]]:
    """``model.reward`` split at commas, each with its weight (``model.reward_weights``, default 1)."""
    specs = [s.strip() for s in cfg.reward.split(",")]
    if not all(specs):
        raise ConfigError(f"`model.reward`={cfg.reward!r} has an empty entry; separate rewards by single commas")
    weights = list(cfg.reward_weights) or [1.0] * len(specs)
    if len(weights) != len(specs):
        raise ConfigError(f"`model.reward_weights` has {len(weights)} weights for {len(specs)} rewards "
                          f"({', '.join(specs)}); give one per reward, in order")
    return list(zip(specs, weights))
