"""The policy behind an OpenAI-compatible endpoint (docs/agents.md, "The endpoint").

``POST /episodes/{eid}/v1/chat/completions`` and ``/episodes/{eid}/v1/completions`` on 127.0.0.1:
each episode's client gets a ``base_url`` naming it, so every call is recorded in its episode
(:class:`~ppo_lm.rollout.agents.calls.EpisodeCalls`). The HTTP server runs in a thread of its own
(uvicorn); the sampling runs on the thread that calls :meth:`AgentEndpoint.serve` — the trainer's,
which owns the engine and the tokenizer — and takes every request waiting at once into one
generation step, so concurrent episodes decode as one batch. Sampling beyond a request's own
``max_tokens`` or past a stop string only adds tokens that are then cut away: what is kept is
distributed as if sampled alone.
"""

from __future__ import annotations

import asyncio
import queue
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, replace

import torch

from ...data.examples import pad_sequences
from ..envs.environment import EnvError, Renderer
from ..sample.engine import GenerationEngine
from ..sample.sampling import SamplingParams
from .calls import EpisodeCalls
from .openai_api import (
    CHAT,
    COMPLETION,
    BadRequest,
    CallRequest,
    Choice,
    chat_body,
    completion_body,
    cut_at_stop,
    error_body,
    parse_request,
)


@dataclass
class _Pending:
    eid: int
    kind: str
    body: object
    answer: Future  # (status, JSON body)


@dataclass
class _Row:
    """One choice to sample: its request's prompt, and where its answer goes."""

    pending: _Pending
    request: CallRequest
    text: str  # the prompt's text ("" for a prompt given as ids)
    ids: list[int]
    parent: int | None
    observation: list[int]


class AgentEndpoint:
    """The endpoint of a run: ``renderer`` renders chat requests (the run's chat template and tokenizer);
    ``sampling`` is the run's (its temperature and top-p are every request's; its ``max_new_tokens``
    bounds each answer); ``max_context``: the tokens a prompt and its answer may hold together."""

    def __init__(self, renderer: Renderer, sampling: SamplingParams, *, max_context: int, model_name: str = "policy"):
        self.renderer, self.tokenizer, self.sampling = renderer, renderer.tokenizer, sampling
        self.max_context, self.model_name = max_context, model_name
        self.episodes: dict[int, EpisodeCalls] = {}
        self._queue: queue.Queue[_Pending] = queue.Queue()
        self._server = self._thread = None
        self.port = 0
        self.batches: list[int] = []  # choices sampled per generation step (for the diagnostics)
        self._now = sampling  # what :meth:`serve` samples with

    # -- the HTTP side (the server's thread) ----------------------------------------------------------
    def start(self) -> AgentEndpoint:
        """Serve on a free port of 127.0.0.1 until :meth:`stop`."""
        import uvicorn

        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(self._app(), log_level="warning", lifespan="off")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [sock]}, daemon=True,
                                        name="ppo-lm-endpoint")
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise EnvError("the agents' endpoint did not start on 127.0.0.1")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
            self._thread.join(timeout=10)
            self._server, self.port = None, 0

    def base_url(self, eid: int) -> str:
        """What an episode's OpenAI client is given: its calls are recorded in episode ``eid``."""
        return f"http://127.0.0.1:{self.port}/episodes/{eid}/v1"

    def _app(self):
        from starlette.applications import Starlette
        from starlette.responses import JSONResponse
        from starlette.routing import Route

        async def answer(request, kind: str):
            eid = request.path_params["eid"]
            if eid not in self.episodes:  # refused at once: no generation step need be running
                return JSONResponse(error_body(_not_running(eid)), status_code=409)
            try:
                body = await request.json()
            except ValueError:
                return JSONResponse(error_body("the request body is not JSON"), status_code=400)
            pending = _Pending(eid, kind, body, Future())
            self._queue.put(pending)
            status, payload = await asyncio.wrap_future(pending.answer)
            return JSONResponse(payload, status_code=status)

        async def chat(request):
            return await answer(request, CHAT)

        async def completions(request):
            return await answer(request, COMPLETION)

        async def models(request):
            return JSONResponse({"object": "list", "data": [{"id": self.model_name, "object": "model",
                                                              "owned_by": "ppo-lm"}]})

        base = "/episodes/{eid:int}/v1"
        return Starlette(routes=[Route(f"{base}/chat/completions", chat, methods=["POST"]),
                                 Route(f"{base}/completions", completions, methods=["POST"]),
                                 Route(f"{base}/models", models, methods=["GET"])])

    # -- episodes ---------------------------------------------------------------------------------------
    def open(self, eid: int) -> EpisodeCalls:
        """Record the calls to ``base_url(eid)`` from now on."""
        self.episodes[eid] = EpisodeCalls(self.renderer)
        return self.episodes[eid]

    def close(self, eid: int) -> EpisodeCalls:
        """Stop recording episode ``eid``: a later call to it is refused (409). Returns its calls."""
        return self.episodes.pop(eid)

    # -- the sampling side (the caller's thread) --------------------------------------------------------
    def serve(self, engine: GenerationEngine, generator: torch.Generator | None, done: Callable[[], bool], *,
              sampling: SamplingParams | None = None, poll_s: float = 0.005, gather_s: float = 0.05) -> None:
        """Answer requests until ``done()``: each step samples the requests waiting, as one batch, with
        ``sampling`` (default the run's; held-out evaluation's is greedy — requests are still checked
        against the run's). A step starts once every open episode has a request waiting, or ``gather_s``
        after the last one came: the episodes of a batch answered together ask again at nearly the same
        moment, and one step for all of them decodes far faster than one for the first and one for the rest."""
        self._now = sampling or self.sampling
        with engine.session():
            while not done():
                try:
                    waiting = [self._queue.get(timeout=poll_s)]
                except queue.Empty:
                    continue
                while len(waiting) < len(self.episodes):
                    try:
                        waiting.append(self._queue.get(timeout=gather_s))
                    except queue.Empty:
                        break
                self.step(engine, generator, waiting)

    def refuse_waiting(self, message: str) -> None:
        """Answer every request still waiting with a 503 (the run is stopping)."""
        while True:
            try:
                self._queue.get_nowait().answer.set_result((503, error_body(message, kind="server_error")))
            except queue.Empty:
                return

    def step(self, engine: GenerationEngine, generator: torch.Generator | None, waiting: list[_Pending]) -> None:
        """One generation step for ``waiting``: each request checked and rendered (a refused one
        answered at once), every choice of every request sampled in one batch, each answered."""
        rows = []
        for pending in waiting:
            try:
                rows += self._rows(pending)
            except (BadRequest, EnvError) as e:  # EnvError: the chat template refuses the messages
                pending.answer.set_result((getattr(e, "status", 400), error_body(str(e), getattr(e, "param", None))))
        if not rows:
            return
        limit = max(self._limit(r) for r in rows)
        ids, mask = pad_sequences([r.ids for r in rows], self.tokenizer.pad_token_id, side="left")
        params = replace(self._now, max_new_tokens=limit, min_new_tokens=min(self._now.min_new_tokens, limit))
        gen = engine.generate(ids, mask, params, generator=generator, return_logprobs=True)
        self.batches.append(len(rows))
        lengths, stopped = gen.mask.sum(1).tolist(), gen.terminated.tolist()
        answers: dict[int, tuple[_Row, list[Choice]]] = {}  # per request: its first row, its choices
        for k, r in enumerate(rows):
            n = min(lengths[k], self._limit(r))
            ended = stopped[k] and n == lengths[k]
            choice = self._choice(r, gen.responses[k, :n].tolist(), gen.logprobs[k, :n].tolist(), ended, engine.version)
            answers.setdefault(id(r.pending), (r, []))[1].append(choice)
        for first, choices in answers.values():
            self._answer(first.pending, first.request, choices, len(first.ids))

    def _limit(self, row: _Row) -> int:
        room = self.max_context - len(row.ids)
        most = self._now.max_new_tokens
        return max(min(most, row.request.max_tokens or most, room), 1)

    def _rows(self, pending: _Pending) -> list[_Row]:
        calls = self.episodes.get(pending.eid)
        if calls is None:
            raise BadRequest(_not_running(pending.eid), status=409)
        request = parse_request(pending.kind, pending.body, temperature=self.sampling.temperature,
                                top_p=self.sampling.top_p)
        request.model = self.model_name if request.model == "policy" else request.model
        if request.kind == CHAT:
            text = calls.chat_text(request.messages, request.tools)
            ids, parent, obs = calls.prompt(text)
        elif isinstance(request.prompt, str):
            text = request.prompt
            ids, parent, obs = calls.prompt(text)
        else:
            text = ""
            ids, parent, obs = calls.prompt_from_ids(request.prompt)
        if len(ids) >= self.max_context:
            raise BadRequest(f"the prompt has {len(ids)} tokens, which leaves no room for an answer in the episode's "
                             f"{self.max_context} (`rollout.max_episode_tokens`)", "messages")
        return [_Row(pending, request, text, ids, parent, obs) for _ in range(request.n)]

    def _choice(self, row: _Row, sampled: list[int], logprobs: list[float], ended: bool, version: int) -> Choice:
        """Record one sampled answer in its episode; what the client receives is the text before the stop
        token, or before a stop string (the ids kept then end with the token that completed it)."""
        decode = self.tokenizer.decode
        body = sampled[:-1] if ended else sampled
        text, end = cut_at_stop(decode(body, skip_special_tokens=True), row.request.stop)
        if end is not None:
            k = next(k for k in range(1, len(body) + 1) if len(decode(body[:k], skip_special_tokens=True)) >= end)
            sampled, logprobs, body, ended = body[:k], logprobs[:k], body[:k], True
        calls = self.episodes.get(row.pending.eid)
        if calls is not None:
            calls.record(row.text or decode(row.ids, skip_special_tokens=False), row.ids, row.parent,
                         row.observation, sampled, logprobs, version)
        return Choice(text, sampled, logprobs, "stop" if ended else "length", [decode([t]) for t in sampled],
                      raw=decode(body, skip_special_tokens=False))

    def _answer(self, pending: _Pending, request: CallRequest, choices: list[Choice], prompt_tokens: int) -> None:
        calls = self.episodes.get(pending.eid)
        call_id = f"{'chatcmpl' if request.kind == CHAT else 'cmpl'}-{pending.eid}-{len(calls.calls) if calls else 0}"
        if request.kind != CHAT:
            pending.answer.set_result((200, completion_body(request, choices, call_id, prompt_tokens)))
            return
        body = chat_body(request, choices, call_id, prompt_tokens)
        if calls is not None:
            for choice, out in zip(choices, body["choices"]):
                calls.returned(out["message"], choice.raw)
        pending.answer.set_result((200, body))


def _not_running(eid: int) -> str:
    return f"episode {eid} is not running: its calls are no longer recorded"
