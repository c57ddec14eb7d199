"""One agent episode's calls, recorded token-exact (docs/agents.md, "Token-exact trajectories").

Each call's prompt is built from the previous call where it can be: when the text a request renders
to starts with the text of an earlier call's prompt and what that call sampled, its ids are that
call's prompt ids, then the ids it sampled — as sampled, never re-tokenized — then the rendering's
remaining text tokenized: the observation tokens between two turns (no loss, no value target). A
prompt that extends no earlier call (the agent's harness rewrote the history) starts a new segment,
tokenized whole. An assistant message the endpoint returned is rendered as the text it sampled (its
``<tool_call>`` blocks as written, not as the template would re-write OpenAI's ``tool_calls``), so an
agent that sends back what it received extends its prompts.

The calls form chains, each call the child of the call it extends; a segment is a chain from a
call that extends nothing to a call nothing extends (several with ``n`` > 1 choices kept apart).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from ..envs.environment import Renderer
from ..trajectory import Trajectory


@dataclass
class Call:
    """One sampled answer of one request: ``prompt_ids`` (the whole context), ``sampled`` (a stop token
    included) and their log-probabilities, the ``version`` of the weights that sampled it, ``parent``
    (the index of the call it extends; None: it starts a segment) and ``observation`` (the ids between
    the parent's last sampled token and this prompt's end). ``context`` is the text a later prompt
    must start with to extend it: this prompt's text and what was sampled."""

    prompt_ids: list[int]
    sampled: list[int]
    logprobs: list[float]
    version: int
    parent: int | None
    observation: list[int]
    context: str


class EpisodeCalls:
    """The calls of one episode, and the prompts its requests render to. ``renderer``: the run's chat
    template (and tokenizer) — the same rendering the built-in environments use."""

    def __init__(self, renderer: Renderer):
        self.renderer, self.tokenizer = renderer, renderer.tokenizer
        self.calls: list[Call] = []
        self._returned: dict[str, str] = {}  # an assistant message as returned → the text sampled

    # -- prompts ------------------------------------------------------------------------------------
    def chat_text(self, messages: list[dict], tools: list[dict] | None) -> str:
        """The chat template's text of ``messages`` and the assistant's opening, the messages this
        episode was answered with rendered as the text sampled."""
        own = [{"role": "assistant", "content": self._returned[key]}
               if m.get("role") == "assistant" and (key := _key(m)) in self._returned else m for m in messages]
        return self.renderer.render(own, True, tools)

    def prompt(self, text: str) -> tuple[list[int], int | None, list[int]]:
        """The ids of a prompt ``text``: the ids of the latest call whose context it extends, then the
        rest tokenized (that call's index and those observation ids); else ``text`` tokenized whole."""
        for i in range(len(self.calls) - 1, -1, -1):
            call = self.calls[i]
            if text.startswith(call.context):
                rest = self._ids(text[len(call.context):])
                return call.prompt_ids + call.sampled + rest, i, rest
        return self._ids(text), None, []

    def prompt_from_ids(self, ids: list[int]) -> tuple[list[int], int | None, list[int]]:
        """As :meth:`prompt` for a prompt given as token ids (``/v1/completions``)."""
        for i in range(len(self.calls) - 1, -1, -1):
            head = self.calls[i].prompt_ids + self.calls[i].sampled
            if ids[:len(head)] == head:
                return list(ids), i, list(ids[len(head):])
        return list(ids), None, []

    def _ids(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"] if text else []

    # -- records ------------------------------------------------------------------------------------
    def record(self, prompt_text: str, prompt_ids: list[int], parent: int | None, observation: list[int],
               sampled: list[int], logprobs: list[float], version: int) -> Call:
        """Add one sampled answer; what a later prompt must start with to extend it is the prompt's text
        and the sampled ids' text (special tokens written out, as the template writes them)."""
        context = prompt_text + self.tokenizer.decode(sampled, skip_special_tokens=False)
        call = Call(list(prompt_ids), list(sampled), list(logprobs), version, parent, list(observation), context)
        self.calls.append(call)
        return call

    def returned(self, message: dict, sampled_text: str) -> None:
        """The endpoint answered with ``message``; rendered later as ``sampled_text``."""
        self._returned[_key(message)] = sampled_text

    def segments(self) -> list[list[int]]:
        """The chains of calls, oldest first, each a list of call indices from a call that extends
        nothing to one that nothing extends."""
        parents = {c.parent for c in self.calls}
        chains = []
        for leaf in (i for i in range(len(self.calls)) if i not in parents):
            chain = [leaf]
            while self.calls[chain[-1]].parent is not None:
                chain.append(self.calls[chain[-1]].parent)
            chains.append(chain[::-1])
        return sorted(chains)

    def trajectory(self, chain: list[int]) -> Trajectory:
        """One segment as a trajectory: its first prompt, then each call's sampled ids and the
        observation ids before the next (no turn rewards: the caller adds them)."""
        first = self.calls[chain[0]]
        traj = Trajectory(list(first.prompt_ids), version=first.version)
        for k, i in enumerate(chain):
            call = self.calls[i]
            if k:
                traj.add_observation(call.observation)
            traj.add_action(call.sampled, call.logprobs)
        return traj


def _key(message: dict) -> str:
    """An assistant message as the endpoint returned it and as a client sends it back: its content and
    its tool calls (name and arguments, the arguments parsed — a client may re-serialise them)."""
    calls = []
    for c in message.get("tool_calls") or ():
        fn = c.get("function", {}) if isinstance(c, dict) else {}
        args = fn.get("arguments")
        try:
            args = json.loads(args) if isinstance(args, str) else args
        except json.JSONDecodeError:
            pass
        calls.append([fn.get("name"), args])
    return json.dumps([message.get("content") or None, calls], sort_keys=True)
