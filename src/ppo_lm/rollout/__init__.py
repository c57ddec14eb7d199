"""Step 1–3 of the loop: sampling responses, scoring them, and the rollout batch the update trains on;
plus greedy evaluation on held-out prompts."""

from .steps import Reward

__all__ = ["Reward"]
