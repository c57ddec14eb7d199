"""The verifiable reward of the recipe: 1 when the last number in the response is the answer, else 0.

ppo-lm calls a verifier as ``fn(prompts, responses, **columns)``: ``responses`` are the decoded
responses without the end-of-turn token, and every other column of the prompt file (here ``answer``)
arrives as a list of the same length. Use it as ``--model.reward examples/real_model/rewards.py:correct``.
"""

from __future__ import annotations

import re

NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def last_number(text: str) -> float | None:
    """The last number written in ``text`` (thousands separators dropped), or None."""
    found = NUMBER.findall(text.replace(",", ""))
    return float(found[-1]) if found else None


def correct(prompts: list[str], responses: list[str], answer: list[str], **columns) -> list[float]:
    """1.0 where the response's last number equals ``answer``, else 0.0."""
    return [float(last_number(r) == float(a)) for r, a in zip(responses, answer)]
