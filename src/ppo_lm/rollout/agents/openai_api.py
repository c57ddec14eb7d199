"""The OpenAI API as the endpoint speaks it (docs/agents.md, "The endpoint"): a request body checked
into a :class:`CallRequest`, and the bodies of the answers.

What a request may say is what the endpoint can honour while training on what it samples: the
sampling temperature and top-p are the run's (``rollout.temperature``, ``rollout.top_p``), because the
learner's log-probabilities are computed at them — a request may repeat them but not change them.
``max_tokens`` is a limit beside the run's ``rollout.max_new_tokens`` (the smaller holds; the
``finish_reason`` says ``length``). Any other parameter OpenAI defines (``presence_penalty``,
``logit_bias``, ``seed``, ``stream``, ``response_format`` …) is refused with a 400 and one line naming
it, never a silent default.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

from ..envs.tools import TOOL_CALL, parse_tool_calls

CHAT = "chat"
COMPLETION = "completion"
# fields that change nothing the endpoint does (who asks, what they call the model, bookkeeping)
_INERT = {"model", "user", "metadata", "store", "parallel_tool_calls", "service_tier"}
_SHARED = {"temperature", "top_p", "max_tokens", "stop", "n", "logprobs", "stream"}
ACCEPTED = {CHAT: _INERT | _SHARED | {"messages", "tools", "tool_choice", "top_logprobs", "max_completion_tokens"},
            COMPLETION: _INERT | _SHARED | {"prompt", "echo"}}
MAX_STOP, MAX_N = 4, 16


class BadRequest(ValueError):
    """A request the endpoint refuses (HTTP ``status``, 400 unless said): one line, naming the parameter
    (``param``)."""

    def __init__(self, message: str, param: str | None = None, status: int = 400):
        super().__init__(message)
        self.param, self.status = param, status


@dataclass
class CallRequest:
    """One checked request. ``messages`` (chat) or ``prompt`` (a text or token ids, completions);
    ``max_tokens``: the request's own limit (None: the run's); ``stop``: strings that end a choice
    (cut before them, as OpenAI does); ``n`` choices; ``logprobs``: return the sampled tokens'
    log-probabilities."""

    kind: str
    messages: list[dict] | None = None
    prompt: str | list[int] | None = None
    tools: list[dict] | None = None
    max_tokens: int | None = None
    stop: tuple[str, ...] = ()
    n: int = 1
    logprobs: bool = False
    model: str = "policy"


@dataclass
class Choice:
    """One sampled answer: its text (cut before a stop string), the ids sampled (a stop token
    included), their log-probabilities and why it ended (``stop`` or ``length``)."""

    text: str
    ids: list[int]
    logprobs: list[float]
    finish_reason: str
    tokens: list[str] = field(default_factory=list)  # each id's text, for the logprobs field
    raw: str = ""  # the text sampled, special tokens written out, stop token left off: how it is rendered back


def _number(body: dict, name: str, lo: float, hi: float, integer: bool = False):
    value = body.get(name)
    if value is None:
        return None
    kind = int if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kind) or not lo <= value <= hi:
        raise BadRequest(f"`{name}` {value!r}: give {'an integer' if integer else 'a number'} from {lo} to {hi}", name)
    return value


def _check_sampling(body: dict, temperature: float, top_p: float) -> None:
    for name, run, setting in (("temperature", temperature, "rollout.temperature"), ("top_p", top_p, "rollout.top_p")):
        value = _number(body, name, 0, 2 if name == "temperature" else 1)
        if value is not None and abs(value - run) > 1e-9:
            raise BadRequest(f"`{name}` {value}: this endpoint samples at the run's {setting} {run}, which the "
                             f"learner's log-probabilities use; leave `{name}` out or set {setting}", name)


def parse_request(kind: str, body: object, *, temperature: float, top_p: float) -> CallRequest:
    """``body`` (the request's JSON) checked; a :class:`BadRequest` for anything the endpoint cannot honour."""
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    unknown = sorted(set(body) - ACCEPTED[kind])
    if unknown:
        raise BadRequest(f"`{unknown[0]}` is not served by the ppo-lm endpoint, which samples from the policy as it "
                         f"is trained (docs/agents.md); leave it out", unknown[0])
    _check_sampling(body, temperature, top_p)
    if body.get("stream"):
        raise BadRequest("`stream`: the ppo-lm endpoint answers whole; leave `stream` out", "stream")
    stop = body.get("stop") or ()
    stop = (stop,) if isinstance(stop, str) else stop
    if not (isinstance(stop, (list, tuple)) and len(stop) <= MAX_STOP and all(isinstance(s, str) and s for s in stop)):
        raise BadRequest(f"`stop`: give a string or a list of at most {MAX_STOP} non-empty strings", "stop")
    max_tokens = _number(body, "max_completion_tokens", 1, 1 << 30, True) or _number(body, "max_tokens", 1, 1 << 30, True)
    request = CallRequest(kind, max_tokens=max_tokens, stop=tuple(stop), n=_number(body, "n", 1, MAX_N, True) or 1,
                          model=str(body.get("model") or "policy"))
    if kind == CHAT:
        _parse_chat(body, request)
    else:
        _parse_completion(body, request)
    return request


def _parse_chat(body: dict, request: CallRequest) -> None:
    messages = body.get("messages")
    if not (isinstance(messages, list) and messages and all(isinstance(m, dict) and "role" in m for m in messages)):
        raise BadRequest("`messages`: give a non-empty list of {'role', 'content'} messages", "messages")
    request.messages = [_plain(m) for m in messages]
    tools = body.get("tools")
    if tools is not None and not (isinstance(tools, list) and all(isinstance(t, dict) for t in tools)):
        raise BadRequest("`tools`: give a list of {'type': 'function', 'function': {...}} tools", "tools")
    request.tools = tools or None
    choice = body.get("tool_choice")
    if choice not in (None, "auto", "none"):
        raise BadRequest(f"`tool_choice` {choice!r}: the policy chooses its own calls; give 'auto' or leave it out",
                         "tool_choice")
    if choice == "none":
        request.tools = None
    top = body.get("top_logprobs")
    if top not in (None, 0):
        raise BadRequest("`top_logprobs`: the endpoint returns the sampled tokens' log-probabilities only; give 0 or "
                         "leave it out", "top_logprobs")
    request.logprobs = bool(body.get("logprobs"))


def _plain(message: dict) -> dict:
    """A message with its content as text: a list of text parts joined (images are refused)."""
    content = message.get("content")
    if isinstance(content, list):
        if not all(isinstance(p, dict) and p.get("type") == "text" for p in content):
            raise BadRequest("`messages`: only text content parts are served", "messages")
        message = {**message, "content": "".join(p.get("text", "") for p in content)}
    return message


def _parse_completion(body: dict, request: CallRequest) -> None:
    prompt = body.get("prompt")
    ids = isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)
    if not (isinstance(prompt, str) and prompt) and not ids:
        raise BadRequest("`prompt`: give one text or one list of token ids", "prompt")
    if body.get("echo"):
        raise BadRequest("`echo`: the endpoint answers with the completion only; leave `echo` out", "echo")
    logprobs = body.get("logprobs")
    if logprobs not in (None, 0, False, True):
        raise BadRequest("`logprobs`: the endpoint returns the sampled tokens' log-probabilities only; give 0 or "
                         "leave it out", "logprobs")
    request.prompt, request.logprobs = prompt, logprobs is not None and logprobs is not False


def cut_at_stop(text: str, stop: tuple[str, ...]) -> tuple[str, int | None]:
    """``text`` before the first of the ``stop`` strings, and where that string ends (None: none)."""
    hits = [(text.find(s), s) for s in stop if s in text]
    if not hits:
        return text, None
    at, s = min(hits)
    return text[:at], at + len(s)


def tool_calls_of(text: str, call_id: str) -> tuple[str | None, list[dict]]:
    """A chat answer's content and its well-formed ``<tool_call>`` blocks in OpenAI's form (a block that
    does not parse stays in the content, for the agent to see)."""
    calls, kept = [], text
    for block, parsed in zip(TOOL_CALL.finditer(text), parse_tool_calls(text)):
        if isinstance(parsed, dict):
            calls.append({"id": f"{call_id}-{len(calls)}", "type": "function",
                          "function": {"name": parsed["name"], "arguments": json.dumps(parsed["arguments"])}})
            kept = kept.replace(block.group(0), "", 1)
    return (kept.strip() or None, calls) if calls else (text, [])


def chat_body(request: CallRequest, choices: list[Choice], call_id: str, prompt_tokens: int) -> dict:
    """The ``chat.completion`` answer."""
    out = []
    for i, c in enumerate(choices):
        content, calls = tool_calls_of(c.text, f"{call_id}-{i}") if request.tools else (c.text, [])
        message = {"role": "assistant", "content": content}
        if calls:
            message["tool_calls"] = calls
        logprobs = ({"content": [{"token": t, "logprob": lp, "bytes": list(t.encode()), "top_logprobs": []}
                                 for t, lp in zip(c.tokens, c.logprobs)]} if request.logprobs else None)
        out.append({"index": i, "message": message, "logprobs": logprobs,
                    "finish_reason": "tool_calls" if calls else c.finish_reason})
    return {"id": call_id, "object": "chat.completion", "created": int(time.time()), "model": request.model,
            "choices": out, "usage": _usage(choices, prompt_tokens)}


def completion_body(request: CallRequest, choices: list[Choice], call_id: str, prompt_tokens: int) -> dict:
    """The ``text_completion`` answer."""
    out = []
    for i, c in enumerate(choices):
        offsets = [sum(len(t) for t in c.tokens[:k]) for k in range(len(c.tokens))]
        logprobs = ({"tokens": c.tokens, "token_logprobs": c.logprobs, "top_logprobs": None, "text_offset": offsets}
                    if request.logprobs else None)
        out.append({"index": i, "text": c.text, "logprobs": logprobs, "finish_reason": c.finish_reason})
    return {"id": call_id, "object": "text_completion", "created": int(time.time()), "model": request.model,
            "choices": out, "usage": _usage(choices, prompt_tokens)}


def _usage(choices: list[Choice], prompt_tokens: int) -> dict:
    completion = sum(len(c.ids) for c in choices)
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion, "total_tokens": prompt_tokens + completion}


def error_body(message: str, param: str | None = None, kind: str = "invalid_request_error") -> dict:
    """OpenAI's error shape: the client raises it with ``message`` as its text."""
    return {"error": {"message": message, "type": kind, "param": param, "code": None}}
