"""The built-in multi-turn task (docs/environments.md): the linear equations of
:mod:`ppo_lm.tasks.equations` with feedback — a wrong answer is told so, the equation is asked again,
and the episode goes on until an answer is right or the turns run out (`rollout.max_turns`).

A right answer on turn k earns ``FIRST_TRY ** (k − 1)`` (1, then 0.5, 0.25, …) on that turn; wrong
turns earn 0. Credit inside an episode matters here: an episode that fails first and succeeds later
holds a wrong answer followed by a right one, and only a per-token critic can tell the two apart —
an episode-level advantage (GRPO, RLOO) gives both turns the same sign.

One character per token (the built-in tokenizer); the feedback is ``"no\\n" + prompt``, so the second
try is asked the question the policy knows::

    Solve 2x+3=11\\n x=5<eos> no\\nSolve 2x+3=11\\n x=4<eos>
"""

from __future__ import annotations

from .equations import verify

FIRST_TRY = 0.5
"""Reward factor per extra turn: a right answer on turn k earns FIRST_TRY ** (k − 1)."""

FEEDBACK = "no\n"


class EquationsRetry:
    """``rollout.env builtin:equations_retry``: one episode of the protocol in docs/environments.md."""

    def reset(self, row: dict, seed: int) -> str:
        self.prompt, self.answer, self.turn = row["prompt"], row.get("answer"), 0
        return self.prompt

    def step(self, text: str) -> tuple[str | None, float, bool]:
        self.turn += 1
        if verify([self.prompt], [text], answer=[self.answer])[0] == 1.0:
            return None, FIRST_TRY ** (self.turn - 1), True
        return FEEDBACK + self.prompt, 0.0, False


BUILTIN_ENVS = {"builtin:equations_retry": EquationsRetry}
