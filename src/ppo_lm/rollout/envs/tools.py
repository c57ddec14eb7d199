"""Tools for multi-turn environments (docs/environments.md): Python functions the model may call.

The functions go to the chat template's ``tools`` (their type hints and Google-style docstrings are
the schema transformers renders); the model calls them in the Qwen / Hermes form its template
teaches, ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``; each call runs in a process of
its own, forked from the environment's worker, whose process group is killed at the call's time limit
and when it returns — code blocked in C stops too, and what the tool started — and its result comes
back as a ``tool`` message. A call the model got wrong — JSON that does not parse or nests too deep, a
``<tool_call>`` never closed, a tool that does not exist, arguments the function refuses, a result
JSON cannot write, a call past the time limit — is answered with an ``error: …`` tool message, as a
tool would answer it: the model's mistake is part of the episode, not the run's failure.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import select
import signal
import sys
import time

from ...runtime.lifetime import die_with_parent
from ...runtime.user_code import one_line
from .environment import EnvError

TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)
OPEN, CLOSE = "<tool_call>", "</tool_call>"


def parse_tool_calls(text: str) -> list[dict | str]:
    """The ``<tool_call>{json}</tool_call>`` blocks of an assistant turn, in order: each a dict with
    ``name`` (str) and ``arguments`` (dict), or the error message for a block that is not one — and
    for a ``<tool_call>`` left open after the last closed one (the model meant a call: answering it
    with an error keeps the episode going, where scoring it as the final answer would not)."""
    calls = [_parse_block(block) for block in TOOL_CALL.findall(text)]
    after_last = text[text.rfind(CLOSE) + len(CLOSE):] if CLOSE in text else text
    if OPEN in after_last:
        calls.append(f"error: a {OPEN} without its {CLOSE}; a tool call is "
                     f'{OPEN}{{"name": "<tool>", "arguments": {{...}}}}{CLOSE}')
    return calls


def _parse_block(block: str) -> dict | str:
    try:
        call = json.loads(block)
    except json.JSONDecodeError as e:
        return f"error: the tool call is not valid JSON ({e.msg} at character {e.pos})"
    except RecursionError:
        return "error: the tool call's JSON nests too deep"
    args = call.get("arguments", {}) if isinstance(call, dict) else None
    if isinstance(args, str):  # some templates write the arguments as a JSON string
        try:
            args = json.loads(args)
        except (json.JSONDecodeError, RecursionError):
            args = None
    if not (isinstance(call, dict) and isinstance(call.get("name"), str) and isinstance(args, dict)):
        return 'error: a tool call is {"name": "<tool>", "arguments": {...}}'
    return {"name": call["name"], "arguments": args}


def run_tool_call(tools: dict, call: dict | str, seconds: float) -> str:
    """The result of one parsed call as a tool message's text: ``json.dumps`` of what the function
    returned (a str as it is), or ``error: …``. The function runs in a forked child process, killed
    when it runs past ``seconds``: what it changes in memory stays in that child (a tool's answer is
    its return value; an episode's state belongs to the environment's ``step``)."""
    if isinstance(call, str):
        return call
    fn = tools.get(call["name"])
    if fn is None:
        return f"error: no tool {call['name']!r}; the tools are {', '.join(sorted(tools))}"
    if not hasattr(os, "fork"):
        raise EnvError("tool calls run in forked processes, which this platform does not have")
    read, write = os.pipe()
    worker = os.getpid()
    pid = os.fork()
    if pid == 0:  # the child: answer, then leave without running the parent's exit handlers
        os.close(read)
        os.setpgid(0, 0)  # a group of its own: what the tool starts is killed with it
        die_with_parent(worker)
        with os.fdopen(write, "wb") as out:
            out.write(_answer(fn, call).encode("utf-8", "replace"))
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    os.close(write)
    with contextlib.suppress(OSError):  # (the child may have done it already, or be gone)
        os.setpgid(pid, pid)
    _tell_watchdog(f"+{pid}")
    try:
        return _collect(pid, read, call["name"], seconds)
    finally:  # a call is over when it returns: what it left running in its group ends with it
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
        _tell_watchdog(f"-{pid}")


GROUPS: int | None = None
"""In an environment's worker: the pipe to its watchdog (:mod:`ppo_lm.runtime.child`),
told of each tool call's process group, so that a trainer's end kills them too."""


def _tell_watchdog(line: str) -> None:
    if GROUPS is not None:
        os.write(GROUPS, (line + "\n").encode())


def _answer(fn, call: dict) -> str:
    try:
        result = fn(**call["arguments"])
    except Exception as e:  # noqa: BLE001 (the model's arguments can make a tool raise anything)
        return f"error: {type(e).__name__}: {one_line(e)}"
    if isinstance(result, str):
        return result
    try:
        return json.dumps(result, default=str)
    except (TypeError, ValueError, RecursionError) as e:  # a circular result, keys JSON cannot take
        return f"error: the tool's result cannot be written as JSON ({type(e).__name__}: {one_line(e)})"


def _collect(pid: int, read: int, name: str, seconds: float) -> str:
    """The child's answer from ``read``, or an error once ``seconds`` pass (the child is killed)."""
    deadline, chunks = time.monotonic() + seconds, []
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pid, signal.SIGKILL)  # the call and whatever it started
                return f"error: {name} ran past its time limit of {seconds:g} s"
            if not readable(read, min(left, 3600.0)):
                continue
            chunk = os.read(read, 1 << 16)
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(read)
        _, status = os.waitpid(pid, 0)
    if not chunks and status:
        return f"error: {name} ended its process ({_how(status)}) without an answer"
    return b"".join(chunks).decode("utf-8", "replace")


def readable(fd: int, seconds: float | None) -> bool:
    """Whether ``fd`` has data (or its end) within ``seconds`` (None: wait). ``poll``, not ``select``,
    which refuses descriptors numbered 1024 and above (a trainer may hold that many files)."""
    poller = select.poll()
    poller.register(fd, select.POLLIN | select.POLLHUP | select.POLLERR)
    return bool(poller.poll(None if seconds is None else int(seconds * 1000)))


def _how(status: int) -> str:
    return f"signal {os.WTERMSIG(status)}" if os.WIFSIGNALED(status) else f"exit code {os.WEXITSTATUS(status)}"


def tool_schemas(tools: list) -> list[dict] | None:
    """The JSON schemas of an environment's ``tools`` for the chat template (a dict is taken as a
    schema already); :class:`EnvError` naming a function transformers cannot describe (no docstring,
    an argument without a type hint or not in ``Args:``)."""
    if not tools:
        return None
    from transformers.utils import get_json_schema

    out = []
    for fn in tools:
        if isinstance(fn, dict):
            out.append(fn)
            continue
        try:
            out.append(get_json_schema(fn))
        except Exception as e:  # noqa: BLE001 (transformers raises several kinds for one cause)
            raise EnvError(f"the environment's tool {getattr(fn, '__name__', fn)!r} cannot be described to the chat "
                           f"template ({type(e).__name__}: {one_line(e)}); give it type hints and a Google-style "
                           "docstring with an Args: section (docs/environments.md)") from None
    return out


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
    """Seconds one tool call may take; a call past it is answered ``error: …``. The step's
    ``rollout.env_timeout_s`` bounds all of a step's calls together: a step past it stops the run."""

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
            return None, self.reward(text), True  # its type is checked as any step's reward
        self.tool_calls += len(calls)
        tools = {fn.__name__: fn for fn in self.tools}
        return [{"role": "tool", "content": run_tool_call(tools, c, self.tool_timeout_s)} for c in calls], 0.0, False
