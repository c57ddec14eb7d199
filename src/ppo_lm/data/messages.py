"""Chat messages as rows hold them. Free of torch: an environment's worker process checks what the
environment returns with it (:mod:`ppo_lm.rollout.envs.env_worker`)."""

from __future__ import annotations


def is_conversation(value: object) -> bool:
    """A prompt given as chat messages: a non-empty list of ``{"role": str, "content": str}``."""
    return (isinstance(value, list) and bool(value)
            and all(isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
                    for m in value))
