"""reasoning-gym's tasks as a run's prompts and reward (docs/environments.md, "reasoning-gym tasks"): ``data.prompts:
reasoning-gym:TASK`` generates the task's problems (PyPI ``reasoning-gym``, the extra
``ppo-lm[reasoning-gym]``; ``create_dataset(TASK, size, seed, **data.task_config)``), and the reward
``reasoning-gym`` — what ``model.reward: auto`` names for them — scores each response with the task's
own ``score_answer`` on the answer taken from it (``data.task_answer``).

Training problems come from the run's seed, held-out ones from a seed of their own
(``trainer/seeds.py``), and no training problem repeats a held-out question. A row holds ``prompt``
(one user turn: the task's question; plain text with ``data.chat_template: none``), ``answer`` and
``metadata`` (the task's, which names it: ``source_dataset``), the columns the reward reads.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import re
import warnings
from collections.abc import Iterable, Mapping
from typing import Any


class TaskError(ValueError):
    """A task, a setting or an answer mode reasoning-gym or this module refuses: one line naming the
    setting (the config's checks raise it as a ConfigError)."""

PREFIX = "reasoning-gym:"
"""A prompt spec naming a task: ``reasoning-gym:chain_sum``."""
REWARD = "reasoning-gym"
"""The reward spec of the tasks' own scorers."""
ANSWERS = ("auto", "last-number", "text", "tag:NAME")
"""How a response's answer is taken (:func:`extract`)."""
EXTRA = "pip install 'ppo-lm[reasoning-gym]' (or: pip install reasoning-gym)"

_TAG = "answer"
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def task_of(spec: str | None) -> str | None:
    """The task a prompt spec names (``reasoning-gym:TASK``), else None."""
    return spec[len(PREFIX):] if spec is not None and spec.startswith(PREFIX) else None


def _factory(field: str):
    try:
        from reasoning_gym import factory
    except ModuleNotFoundError:
        raise TaskError(f"`{field}` names a reasoning-gym task, but reasoning-gym is not installed: {EXTRA}") from None
    return factory


def _close(name: str, known: Iterable[str]) -> str:
    close = difflib.get_close_matches(name, list(known), n=3, cutoff=0.6)
    return f"; close: {', '.join(close)}" if close else ""


def check_task(task: str, config: Mapping[str, Any], field: str = "data.prompts") -> None:
    """A :class:`TaskError` naming ``field`` (or ``data.task_config``) for a task reasoning-gym does not
    have, a setting its config lacks, or settings its own check refuses."""
    factory = _factory(field)
    if task not in factory.DATASETS:
        raise TaskError(f"`{field}`: reasoning-gym has no task {task!r}{_close(task, factory.DATASETS)} "
                          f"({len(factory.DATASETS)} tasks: reasoning_gym.factory.DATASETS)")
    config_cls = factory.DATASETS[task][1]
    settings = [f.name for f in dataclasses.fields(config_cls) if f.name not in ("seed", "size")]
    for key in config:
        if key not in settings:
            raise TaskError(f"`data.task_config`: {task} has no setting {key!r}{_close(key, settings)} "
                              f"(its settings: {', '.join(settings)})")
    try:
        made = config_cls(**config)
        if hasattr(made, "validate"):
            made.validate()
    except (AssertionError, ValueError, TypeError) as e:
        raise TaskError(f"`data.task_config` {dict(config)!r}: {task} refuses it: {e or type(e).__name__}") from None


def make_rows(task: str, config: Mapping[str, Any], size: int, seed: int, *, chat: bool = True,
              exclude: Iterable[str] = (), field: str = "data.prompts") -> list[dict]:
    """Up to ``size`` distinct problems of ``task`` in the generator's seeded order, none of them a question
    of ``exclude``: rows of ``prompt`` (a user turn, or the question's text without ``chat``), ``answer``
    and ``metadata``. A task whose space holds fewer distinct problems gives what it has, with a warning."""
    check_task(task, config, field)
    factory = _factory(field)
    # the generator's items are fixed by (seed, index): a larger size only extends the same sequence
    dataset = factory.create_dataset(task, size=4 * size + 16, seed=seed, **config)
    seen, rows = set(exclude), []
    for i in range(len(dataset)):
        entry = dataset[i]
        question = entry["question"]
        if question in seen:
            continue
        seen.add(question)
        prompt = [{"role": "user", "content": question}] if chat else question
        rows.append({"prompt": prompt, "answer": str(entry["answer"]), "metadata": entry["metadata"]})
        if len(rows) == size:
            return rows
    if not rows:
        raise TaskError(f"`{field}`: {task} gave no problem outside the held-out ones; widen `data.task_config`")
    warnings.warn(f"`{field}`: {task} gave {len(rows)} distinct problems of the {size} asked for "
                  f"(`data.task_size`/`data.task_eval_size`): its settings allow no more", stacklevel=2)
    return rows


def check_answer_mode(mode: str) -> None:
    """A :class:`TaskError` naming ``data.task_answer`` for a mode :func:`extract` does not know."""
    if mode in ANSWERS[:-1] or (mode.startswith("tag:") and re.fullmatch(r"[\w.-]+", mode[4:])):
        return
    raise TaskError(f"`data.task_answer`={mode!r}: choose auto, last-number, text or tag:NAME (e.g. tag:answer)")


def extract(response: str, mode: str = "auto") -> str | None:
    """The answer a response gives, by ``mode``: ``tag:NAME`` the text of its last ``<NAME>…</NAME>``;
    ``last-number`` its last number (thousands commas dropped); ``text`` the whole response, stripped;
    ``auto`` the last ``<answer>`` tag — the format reasoning-gym's own prompts ask for — else the last
    number (a small instruct model answers arithmetic in prose, "47 - 12 = 35."), else the text. None:
    no answer (it scores 0)."""
    if mode == "text":
        return response.strip()
    if mode.startswith("tag:") or mode == "auto":
        tag = mode[4:] if mode != "auto" else _TAG
        found = re.findall(rf"<{re.escape(tag)}>\s?(.*?)\s?</{re.escape(tag)}>", response, flags=re.DOTALL)
        if found or mode != "auto":
            return found[-1].strip() if found else None
    numbers = _NUMBER.findall(response.replace(",", ""))
    if numbers or mode == "last-number":
        return numbers[-1] if numbers else None
    return response.strip()


@functools.cache
def _default_scorer(task: str):
    """``score_answer(answer, entry)`` of ``task`` at its default settings (a composite's part)."""
    return _factory("model.reward").get_score_answer_fn(task)


def reward(mode: str = "auto", task: str | None = None, config: Mapping[str, Any] | None = None):
    """The verifier of reasoning-gym rows: ``fn(prompts, responses, answer, metadata, **columns)`` → the
    task's score of each response's answer (:func:`extract` by ``mode``), in [0, 1]. Rows of ``task``
    (the run's) are scored by a generator made with ``config``, the run's settings, which some scorers
    read; rows of any other task (a composite's parts) at that task's defaults."""
    check_answer_mode(mode)
    if task is not None:
        check_task(task, config or {})
    own = (_factory("model.reward").create_dataset(task, size=1, seed=0, **dict(config or {})).score_answer
           if task is not None else None)

    def score(prompts: list[str], responses: list[str], answer: list[str] | None = None,
              metadata: list[dict] | None = None, **columns) -> list[float]:
        if answer is None or metadata is None:
            raise ValueError("the reasoning-gym reward reads the columns `answer` and `metadata` of reasoning-gym "
                             "prompts (`data.prompts: reasoning-gym:TASK`); these prompts have none")
        out = []
        for r, a, m in zip(responses, answer, metadata):
            name = m["source_dataset"]
            scorer = own if own is not None and name == task else _default_scorer(name)
            out.append(float(scorer(extract(r, mode), {"answer": a, "metadata": m})))
        return out

    score.__name__ = "reasoning_gym"
    return score
