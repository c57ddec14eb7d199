"""Settings that ship as YAML files, for ``--config`` (and copied by users as a start):

- ``demo_ppo.yaml``: the PPO stage of ``ppo-lm demo`` (and of ``ppo-lm compare``) on the built-in task.

The SmolLM2 recipe's file is ``examples/real_model/grpo.yaml``, beside the script that uses it."""

from __future__ import annotations

from pathlib import Path


def preset(name: str) -> Path:
    """The path of the shipped preset ``name`` (``"demo_ppo"``)."""
    return Path(__file__).with_name(f"{name}.yaml")
