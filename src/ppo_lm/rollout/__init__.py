"""Step 1–3 of the loop: sampling responses, scoring them, and the rollout batch the update trains on;
plus greedy evaluation on held-out prompts, and the environments' worker processes.

``Reward`` loads its module on first use (PEP 562), so an environment's worker process, which
imports :mod:`ppo_lm.rollout.env_worker`, does not import torch."""

__all__ = ["Reward"]


def __getattr__(name: str):
    if name == "Reward":
        from .steps import Reward

        return Reward
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
