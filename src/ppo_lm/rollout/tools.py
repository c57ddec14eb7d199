"""Tools for multi-turn environments (docs/environments.md): Python functions the model may call.

The functions go to the chat template's ``tools`` (their type hints and Google-style docstrings are
the schema transformers renders); the model calls them in the Qwen / Hermes form its template
teaches, ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``; each call runs with a time
limit and its result comes back as a ``tool`` message. A call the model got wrong — JSON that does
not parse, a tool that does not exist, arguments the function refuses, a call past the time limit —
is answered with an ``error: …`` tool message, as a tool would answer it: the model's mistake is
part of the episode, not the run's failure.
"""

from __future__ import annotations

import json
import re

from .environment import time_limit

TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


class ToolTimeout(Exception):
    """A tool call ran past ``ToolEnv.tool_timeout_s``."""


def parse_tool_calls(text: str) -> list[dict | str]:
    """The ``<tool_call>{json}</tool_call>`` blocks of an assistant turn, in order: each a dict with
    ``name`` (str) and ``arguments`` (dict), or the error message for a block that is not one."""
    calls = []
    for block in TOOL_CALL.findall(text):
        try:
            call = json.loads(block)
        except json.JSONDecodeError as e:
            calls.append(f"error: the tool call is not valid JSON ({e.msg} at character {e.pos})")
            continue
        args = call.get("arguments", {}) if isinstance(call, dict) else None
        if isinstance(args, str):  # some templates write the arguments as a JSON string
            try:
                args = json.loads(args)
            except json.JSONDecodeError:
                args = None
        if not (isinstance(call, dict) and isinstance(call.get("name"), str) and isinstance(args, dict)):
            calls.append('error: a tool call is {"name": "<tool>", "arguments": {...}}')
            continue
        calls.append({"name": call["name"], "arguments": args})
    return calls


def run_tool_call(tools: dict, call: dict | str, seconds: float) -> str:
    """The result of one parsed call as a tool message's text: ``json.dumps`` of what the function
    returned (a str as it is), or ``error: …``."""
    if isinstance(call, str):
        return call
    fn = tools.get(call["name"])
    if fn is None:
        return f"error: no tool {call['name']!r}; the tools are {', '.join(sorted(tools))}"
    try:
        with time_limit(seconds, f"tool {call['name']}", ToolTimeout):
            result = fn(**call["arguments"])
    except ToolTimeout:
        return f"error: {call['name']} ran past its time limit of {seconds:g} s"
    except Exception as e:  # noqa: BLE001 (the model's arguments can make a tool raise anything)
        return f"error: {type(e).__name__}: {e}"
    return result if isinstance(result, str) else json.dumps(result, default=str)


class ToolEnv:
    """An environment whose model may call ``tools``; subclass it and define :meth:`prompt` and
    :meth:`reward`.

    Each turn with tool calls gets their results as ``tool`` messages (reward 0, the episode goes on);
    the first turn without one is the final answer: :meth:`reward` scores it and the episode ends.
    ``rollout.max_turns`` bounds the calls (an episode still calling then is truncated).
    """

    tools: list = []
    """The functions the model may call (type hints and a docstring each: the template's schema)."""
    tool_timeout_s: float = 5.0
    """Seconds one tool call may take (within the step's own `rollout.env_timeout_s`)."""

    def prompt(self, row: dict) -> list[dict]:
        """The first messages of the episode for ``row``."""
        raise NotImplementedError

    def reward(self, text: str) -> float:
        """The score of the final answer ``text``; ``self.row`` is the episode's row."""
        raise NotImplementedError

    def reset(self, row: dict, seed: int) -> list[dict]:
        self.row, self.seed, self.tool_calls = row, seed, 0
        return self.prompt(row)

    def step(self, text: str) -> tuple[list[dict] | None, float, bool]:
        calls = parse_tool_calls(text)
        if not calls:
            return None, float(self.reward(text)), True
        self.tool_calls += len(calls)
        tools = {fn.__name__: fn for fn in self.tools}
        return [{"role": "tool", "content": run_tool_call(tools, c, self.tool_timeout_s)} for c in calls], 0.0, False
