"""Responses back to text: what a verifier scores (prompts go in through :mod:`ppo_lm.data.prompts`)."""

from __future__ import annotations

from .trajectory import Trajectory


def response_texts(tokenizer, trajectories: list[Trajectory]) -> list[str]:
    """Each single-turn response's text: its ids without the stop token that ended it
    (:meth:`Trajectory.response_ids`), special tokens skipped."""
    return tokenizer.batch_decode([t.response_ids() for t in trajectories], skip_special_tokens=True)
