"""The reward of a reasoning-gym task: the task's own ``score_answer`` of the response's answer.

ppo-lm calls a verifier as ``fn(prompts, responses, **columns)`` with the prompt file's other columns
(here ``answer`` and ``metadata``, as data.py writes them) as lists. The answer handed to the scorer is
the text of the response's last ``<answer>…</answer>`` where it has one (the format reasoning-gym's
own prompts ask for), else its last number, since a small instruct model asked a bare question
answers in prose ("47 - 12 = 35."); a response with neither scores 0. The scorer is the task's: for
chain_sum 1 for the exact answer, len(answer)/len(given) where the answer is inside the given text.
Use it as ``--reward examples/reasoning_gym/rewards.py:score``.
"""

from __future__ import annotations

import functools
import re

ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def extract(response: str) -> str | None:
    """The answer a response gives: its last ``<answer>`` tag's text, else its last number, else None."""
    tagged = ANSWER_TAG.findall(response)
    if tagged:
        return tagged[-1].strip()
    numbers = NUMBER.findall(response.replace(",", ""))
    return numbers[-1] if numbers else None


@functools.cache
def scorer(task: str):
    """``score_answer(answer, entry)`` of the reasoning-gym task named ``task``."""
    import reasoning_gym

    return reasoning_gym.get_score_answer_fn(task)


def score(prompts: list[str], responses: list[str], answer: list[str], metadata: list[dict],
          **columns) -> list[float]:
    """The task's score of each response's answer, in [0, 1]."""
    return [float(scorer(m["source_dataset"])(extract(r), {"answer": a, "metadata": m}))
            for r, a, m in zip(responses, answer, metadata)]
