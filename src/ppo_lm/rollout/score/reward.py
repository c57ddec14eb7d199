"""Scoring complete responses: their text (prompts go in through :mod:`ppo_lm.data.prompts`), rule-based
verifiers and learned reward models (docs/algorithm.md §2)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor, nn

from ...models.actor_critic import RewardScorer, sequence_scores
from ...models.sharding import frozen_mode
from ...runtime.errors import UserError
from ...runtime.user_code import load_object, one_line, user_frames
from ..trajectory import Trajectory
from .step_rewards import Steps, split_rewards

Verifier = Callable[..., Sequence]
"""``f(prompts: list[str], responses: list[str], **columns) -> list[float | Reward]``; columns are the
extra dataset columns of the same rows (lists); a :class:`~ppo_lm.rollout.score.step_rewards.Reward` adds step
rewards to a score."""


def response_texts(tokenizer, trajectories: list[Trajectory]) -> list[str]:
    """Each single-turn response's text: its ids without the stop token that ended it
    (:meth:`Trajectory.response_ids`), special tokens skipped."""
    return tokenizer.batch_decode([t.response_ids() for t in trajectories], skip_special_tokens=True)


class RewardError(UserError, RuntimeError):
    """The reward function failed or returned something unusable; the message shows the prompt."""


@dataclass(frozen=True)
class RewardTerm:
    """One reward of a run: a verifier or a (one-label sequence-classification) reward model, its name
    in the metrics (``score/<name>``) and its weight in the score, Σ_i weight_i · score_i."""

    name: str
    weight: float = 1.0
    verifier: Verifier | None = None
    model: nn.Module | None = None


def combine_terms(terms: Sequence[RewardTerm], scores: Sequence[Tensor]) -> Tensor:
    """Σ_i weight_i · scores_i: (B,) fp32. One term of weight 1 passes its scores through unchanged."""
    if len(terms) == 1 and terms[0].weight == 1.0:
        return scores[0]
    return sum(t.weight * s for t, s in zip(terms, scores))


def term_name(spec: str) -> str:
    """A short metric name for a reward spec: the function's name, 'equations' for the built-in
    verifier, a reward model's directory name."""
    if spec == "builtin:equations":
        return "equations"
    if ":" in Path(spec).name:
        return spec.rsplit(":", 1)[1]
    return Path(spec.rstrip("/")).name or spec


def load_verifier(spec: str, field: str = "model.reward") -> Verifier:
    """Resolve a reward spec to a callable; errors (ValueError) name ``field``.

    ``'builtin:equations'``; ``'path/to/file.py:fn'`` (the file is loaded as a module); or
    ``'module:fn'``, imported with the current directory on the import path, as ``python -m`` and
    ``python script.py`` users expect (a console script does not put it there)."""
    if spec == "builtin:equations":
        from ...tasks.equations import verify

        return verify
    if ":" not in spec:
        raise ValueError(f"`{field}`={spec!r}: expected 'module:function', 'path/to/file.py:function', "
                         "'builtin:equations' or 'reasoning-gym'")
    fn = load_object(spec, field)
    if not callable(fn):
        raise ValueError(f"`{field}`={spec!r}: {spec.rsplit(':', 1)[1]!r} is a {type(fn).__name__}, not a function")
    return fn


def score_with_verifier(
    verifier: Verifier, prompts: list[str], responses: list[str], columns: dict[str, list]
) -> Tensor:
    """The verifier's (B,) fp32 scores (a :class:`~ppo_lm.rollout.score.step_rewards.Reward`'s terminal score; its
    step rewards are for training, :func:`verifier_rewards`), or a :class:`RewardError`."""
    return verifier_rewards(verifier, prompts, responses, columns)[0]


def verifier_rewards(
    verifier: Verifier, prompts: list[str], responses: list[str], columns: dict[str, list]
) -> tuple[Tensor, list[Steps] | None]:
    """Call the verifier and check its answer: ``(scores (B,) fp32, steps per response or None)`` —
    None when it returned only numbers — or a :class:`RewardError` that shows where in the user's code
    a raising verifier failed."""
    try:
        answer = verifier(prompts, responses, **columns)
    except Exception as e:
        raise RewardError(
            f"the reward function raised {type(e).__name__}: {one_line(e)}{user_frames(e)}\n  first prompt of the batch: "
            f"{prompts[0]!r}"
        ) from e
    try:
        values, steps = split_rewards(answer)
    except (TypeError, ValueError) as e:
        raise RewardError(f"the reward function must return a list of numbers (or of Reward, or {{'score', 'steps'}} dicts), got "
                          f"{type(answer).__name__}: {e}") from None
    if len(values) != len(prompts):
        raise RewardError(
            f"the reward function returned {len(values)} scores for {len(prompts)} responses "
            f"(first prompt: {prompts[0]!r})"
        )
    for p, r, v in zip(prompts, responses, values):
        if not math.isfinite(v):
            raise RewardError(f"the reward function returned {v} for prompt {p!r} with response {r!r}")
    for p, r, row in zip(prompts, responses, steps or ()):
        for end, _ in row:
            if not 1 <= end <= len(r):
                raise RewardError(
                    f"the reward function returned a step ending at character {end} of a response of {len(r)} "
                    f"characters (Reward.steps char_end must be in 1 … {len(r)}); prompt {p!r}, response {r!r}")
    return torch.tensor(values, dtype=torch.float32), steps


def score_with_model(model: nn.Module, input_ids: Tensor, attention_mask: Tensor, last_index: Tensor) -> Tensor:
    """Reward-model scores read at ``last_index`` (B,) (the last response token). (B,) fp32.

    ``model``: a sequence-classification model, or a :class:`RewardScorer` around one (FSDP-sharded
    or not)."""
    with frozen_mode(model):
        if isinstance(model, RewardScorer):
            scores = model(input_ids, attention_mask, last_index)
        else:
            scores = sequence_scores(model, input_ids, attention_mask, last_index)
    if not bool(torch.isfinite(scores).all()):
        raise RewardError("the reward model returned a non-finite score")
    return scores.clone()
