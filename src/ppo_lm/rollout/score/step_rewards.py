"""Step rewards inside one response (process rewards, docs/algorithm.md §2.1): what a reward function
may return instead of a number, and where each step's reward lands among the response's tokens."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from ...runtime.user_code import reward_number

Steps = list[tuple[int, float]]
"""One response's step rewards: ``(char_end, reward)`` pairs, ``char_end`` counted in the response text."""


@dataclass(frozen=True)
class Reward:
    """A response's reward with step rewards: ``Reward(score, steps=[(char_end, r), …])``, or the
    same as a dict ``{"score": s, "steps": [(char_end, r), …]}`` (a reward file then imports nothing).

    ``score`` is the terminal score (what a number returned in its place would be); each step reward
    ``r`` lands on the token that completes character ``char_end − 1`` of the response text the reward
    function was given (``char_end`` = the length of the text up to the step's end, 1 … len(text)).
    The trainer's per-token reward is then r_t = Σ steps at t + score·[t = last] − β·kl_t; GAE credits
    each step where it lands, the critic-free estimators see the episode total score + Σ r.
    """

    score: float
    steps: Sequence[tuple[int, float]] = field(default_factory=tuple)

    def __post_init__(self):
        try:
            score = reward_number(self.score)
        except (TypeError, ValueError) as e:
            raise type(e)(f"Reward.score {e}") from None
        steps = []
        for i, step in enumerate(self.steps):
            try:
                end, r = step
            except (TypeError, ValueError):
                raise TypeError(f"Reward.steps[{i}] must be a (char_end, reward) pair, got {step!r}") from None
            if isinstance(end, bool) or not isinstance(end, int) and not (isinstance(end, float) and end.is_integer()):
                raise TypeError(f"Reward.steps[{i}]: char_end must be an int, got {end!r}")
            try:
                r = reward_number(r)
            except (TypeError, ValueError) as e:
                raise type(e)(f"Reward.steps[{i}]: the reward {e}") from None
            steps.append((int(end), r))
        object.__setattr__(self, "score", score)
        object.__setattr__(self, "steps", tuple(steps))

    @property
    def total(self) -> float:
        """score + Σ step rewards: the episode's return without the KL part."""
        return self.score + sum(r for _, r in self.steps)


def split_rewards(values: Sequence) -> tuple[list[float], list[Steps] | None]:
    """A reward function's answer → (scores, steps per response, or None when it returned only numbers).
    Raises TypeError/ValueError for an entry that is neither a number, a :class:`Reward` nor its dict."""
    scores, steps, any_reward = [], [], False
    for i, v in enumerate(values):
        if isinstance(v, Mapping):
            if "score" not in v or set(v) - {"score", "steps"}:
                raise ValueError(f"entry {i} is a dict with keys {sorted(v)}; a step reward's dict has 'score' "
                                 "and 'steps'")
            v = Reward(v["score"], v.get("steps", ()))
        if isinstance(v, Reward):
            any_reward = True
            scores.append(v.score)
            steps.append(list(v.steps))
        else:
            try:
                scores.append(reward_number(v, finite=False))  # checked with its prompt
            except (TypeError, ValueError) as e:
                raise type(e)(f"entry {i} is {e}") from None
            steps.append([])
    return scores, (steps if any_reward else None)


def weighted(steps: list[Steps], weight: float) -> list[Steps]:
    return steps if weight == 1.0 else [[(c, weight * r) for c, r in row] for row in steps]


def merge_steps(terms: Sequence[list[Steps] | None], batch: int) -> list[Steps] | None:
    """Several reward terms' (already weighted) steps, row by row; None when no term had any."""
    given = [t for t in terms if t is not None]
    if not given:
        return None
    return [[s for t in given for s in t[i]] for i in range(batch)]


def token_of_char(decode, ids: list[int], text: str, char_end: int) -> int:
    """Index of the first token among ``ids`` whose prefix decodes to text that starts with
    ``text[:char_end]``: the token that completes that character. ``decode(ids) -> str`` decodes as the
    reward function's text was decoded. A prefix that ends inside a multi-byte character decodes to a
    replacement character and does not match, so the step lands on the token that completes it."""
    target = text[:char_end]
    lo, hi = 1, len(ids)  # the answer k (prefix length) lies in [lo, hi]
    if not decode(ids[:hi]).startswith(target):
        return len(ids) - 1  # the tokenizer's decoding is not prefix-stable here: the last token
    while lo < hi:
        mid = (lo + hi) // 2
        if decode(ids[:mid]).startswith(target):
            hi = mid
        else:
            lo = mid + 1
    return lo - 1


def step_reward_tensor(tokenizer, kept_ids: list[list[int]], texts: list[str], steps: list[Steps], width: int,
                       *, device: torch.device | str = "cpu") -> tuple[Tensor, Tensor]:
    """Place every response's step rewards on its tokens.

    kept_ids: per response, the token ids its text was decoded from (the stop token left out);
    texts: those texts; steps: per response, ``(char_end, r)`` pairs with 1 ≤ char_end ≤ len(text).
    Returns ``(step_rewards (B, width) fp32, step_counts (B,) int64)``; steps on one token add up.
    """
    def decode(ids):
        return tokenizer.decode(ids, skip_special_tokens=True)

    out = torch.zeros(len(texts), width)
    counts = torch.zeros(len(texts), dtype=torch.long)
    for i, (ids, text, row) in enumerate(zip(kept_ids, texts, steps)):
        for end, r in row:
            out[i, token_of_char(decode, ids, text, end)] += r
        counts[i] = len(row)
    return out.to(device), counts.to(device)
