"""Scoring complete responses: rule-based verifiers and learned reward models (docs/algorithm.md §2)."""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable, Sequence

import torch
from torch import Tensor, nn

from ..errors import UserError
from ..models.actor_critic import RewardScorer, sequence_scores
from ..models.sharding import frozen_mode

Verifier = Callable[..., Sequence[float]]
"""``f(prompts: list[str], responses: list[str], **columns) -> list[float]``; columns are the extra
dataset columns of the same rows (lists)."""


class RewardError(UserError, RuntimeError):
    """The reward function failed or returned something unusable; the message shows the prompt."""


def load_verifier(spec: str, field: str = "model.reward") -> Verifier:
    """Resolve ``'module:function'`` (or ``'builtin:equations'``) to a callable; errors name ``field``."""
    if spec == "builtin:equations":
        from ..tasks.equations import verify

        return verify
    if ":" not in spec:
        raise ValueError(f"`{field}`={spec!r}: expected 'module:function' or 'builtin:equations'")
    mod_name, fn_name = spec.split(":", 1)
    try:
        module = importlib.import_module(mod_name)
    except ImportError as e:
        raise ValueError(f"`{field}`={spec!r}: cannot import module {mod_name!r} ({e})") from None
    fn = getattr(module, fn_name, None)
    if not callable(fn):
        raise ValueError(f"`{field}`={spec!r}: module {mod_name!r} has no callable {fn_name!r}")
    return fn


def score_with_verifier(
    verifier: Verifier, prompts: list[str], responses: list[str], columns: dict[str, list]
) -> Tensor:
    """Call the verifier and check its answer: (B,) fp32 scores, or a :class:`RewardError`."""
    try:
        scores = verifier(prompts, responses, **columns)
    except Exception as e:
        raise RewardError(
            f"the reward function raised {type(e).__name__}: {e}\n  first prompt of the batch: {prompts[0]!r}"
        ) from e
    try:
        values = [float(s) for s in scores]
    except (TypeError, ValueError) as e:
        raise RewardError(f"the reward function must return a list of numbers, got {type(scores).__name__}: {e}") from None
    if len(values) != len(prompts):
        raise RewardError(
            f"the reward function returned {len(values)} scores for {len(prompts)} responses "
            f"(first prompt: {prompts[0]!r})"
        )
    for p, r, v in zip(prompts, responses, values):
        if not math.isfinite(v):
            raise RewardError(f"the reward function returned {v} for prompt {p!r} with response {r!r}")
    return torch.tensor(values, dtype=torch.float32)


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
