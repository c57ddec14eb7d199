"""A user's agent played as episodes (docs/agents.md, "Episodes"): ``run(client, row)`` — the user's own
code, sync or async — with a real ``openai`` client (``AsyncOpenAI`` for an ``async def`` agent) whose
``base_url`` names its episode, while the
calling thread samples every request they make through the endpoint.

Each episode runs in a thread of its own (an ``async def`` agent in an event loop of its own there);
the agents' threads only wait on HTTP while the sampling runs on the caller's thread. What an agent
returns is its episode's reward: a number (the last call's turn reward), or one number per call (each
call's turn reward, in the order of the calls). An agent that raises, returns something else, makes no
call, or runs past ``timeout_s`` has an episode error: one line with its own frames, the episode's
calls kept and scored 0. An agent past its time is cut: its episode closes, so its next call is
refused (409), and the thread is left to end on its own.
"""

from __future__ import annotations

import asyncio
import inspect
import math
import threading
import time
import warnings
from dataclasses import dataclass

import torch

from ...runtime.user_code import one_line, user_frames
from ..envs.environment import EnvError
from ..sample.engine import GenerationEngine
from ..sample.sampling import SamplingParams
from ..trajectory import Trajectory
from .calls import EpisodeCalls
from .endpoint import AgentEndpoint


@dataclass
class Episode:
    """One agent episode: its trajectory (the segment holding its last call, rewards on its turns), how
    many segments its calls formed, and its error (None: the agent returned a reward)."""

    traj: Trajectory | None
    segments: int
    error: str | None = None


class AgentEpisodes:
    """Plays ``agent`` (``run(client, row)``) against ``endpoint``, one thread per episode, each cut at
    ``timeout_s``."""

    def __init__(self, agent, endpoint: AgentEndpoint, *, timeout_s: float):
        self.agent, self.endpoint, self.timeout_s = agent, endpoint, timeout_s
        self._next = 0  # episode ids are never reused: a late call of an old episode is refused
        self._http = None  # one connection pool for every sync client: making a client's own takes ~20 ms

    def trajectories(self, engine: GenerationEngine, generator: torch.Generator | None, rows: list[dict],
                     samples: int, sampling: SamplingParams) -> list[Trajectory]:
        """The producer's call: :meth:`play` sampled with ``sampling`` (the endpoint started on first use),
        each episode's trajectory, its segments and its error on it. An episode's error is warned about
        (the first of a batch, and how many); an episode with no call stops the run with one line: there
        is nothing to train on, and its group would be short."""
        if not self.endpoint.port:  # started on first use, and again after close()
            self.endpoint.start()
        episodes = self.play(engine, generator, rows, samples, sampling)
        empty = next((e for e in episodes if e.traj is None), None)
        if empty is not None:
            raise EnvError(f"an episode of `rollout.agent` has no call to train on: {empty.error}; an agent must "
                           "call its client at least once")
        errors = [e.error for e in episodes if e.error]
        if errors:
            warnings.warn(f"{len(errors)} of {len(episodes)} agent episodes ended in an error, scored 0; the first: "
                          f"{errors[0]}", stacklevel=2)
        return [e.traj for e in episodes]

    def close(self) -> None:
        """Stop the endpoint and the clients' connections (started again on the next use)."""
        self.endpoint.stop()
        if self._http is not None:
            self._http.close()
            self._http = None

    def play(self, engine: GenerationEngine, generator: torch.Generator | None, rows: list[dict],
             samples: int, sampling: SamplingParams | None = None) -> list[Episode]:
        """``samples`` episodes per row, group-contiguous, to their end, sampled with ``sampling`` (default
        the endpoint's); their trajectories stamped with the version of the weights that sampled their
        first call."""
        if self._http is None and not inspect.iscoroutinefunction(self.agent):
            import httpx

            self._http = httpx.Client(timeout=self.timeout_s, limits=httpx.Limits(max_connections=None,
                                                                                   max_keepalive_connections=None))
        records, results, threads = {}, {}, []
        for row in rows:
            for _ in range(samples):
                eid, self._next = self._next, self._next + 1
                records[eid] = self.endpoint.open(eid)
                threads.append((eid, threading.Thread(target=self._run, args=(row, eid, results),
                                                      daemon=True, name=f"ppo-lm-agent-{eid}")))
        deadline = time.monotonic() + self.timeout_s
        for _, t in threads:
            t.start()

        def done() -> bool:
            if time.monotonic() > deadline:
                for eid, t in threads:
                    if t.is_alive():
                        results.setdefault(eid, TIMEOUT)
                return True
            return not any(t.is_alive() for _, t in threads)

        try:
            self.endpoint.serve(engine, generator, done, sampling=sampling)
        finally:
            for eid in records:
                self.endpoint.episodes.pop(eid, None)  # a late call is refused
            self.endpoint.refuse_waiting("the episode has ended")
        return [self._episode(records[eid], results[eid], rows[i // samples]) for i, (eid, _) in enumerate(threads)]

    def _run(self, row: dict, eid: int, results: dict) -> None:
        import openai

        settings = dict(base_url=self.endpoint.base_url(eid), api_key="ppo-lm", max_retries=0, timeout=self.timeout_s)
        try:
            if inspect.iscoroutinefunction(self.agent):
                out = asyncio.run(_async_run(self.agent, openai.AsyncOpenAI(**settings), row))
            else:
                out = self.agent(openai.OpenAI(**settings, http_client=self._http), row)
            results.setdefault(eid, _Returned(out))
        except BaseException as e:  # noqa: BLE001 (the user's code: its error is the episode's)
            results.setdefault(eid, f"the agent raised {type(e).__name__}: {one_line(e)}{user_frames(e)}")
        finally:  # its episode is over: a step no longer waits for it, and a late call is refused
            self.endpoint.episodes.pop(eid, None)

    def _episode(self, record: EpisodeCalls, result, row: dict) -> Episode:
        chains = record.segments()
        if not chains:
            return Episode(None, 0, result if isinstance(result, str) else "the agent made no call to its client"
                           if result is not TIMEOUT else f"the agent made no call in {self.timeout_s:g} s")
        chain = next(c for c in chains if c[-1] == len(record.calls) - 1)  # the segment of the last call
        traj = record.trajectory(chain)
        traj.row = row
        error = (f"the agent ran past its time limit of {self.timeout_s:g} s (rollout.agent_timeout_s)"
                 if result is TIMEOUT else result if isinstance(result, str) else None)
        rewards = [0.0] * len(record.calls)
        if error is None:
            rewards, error = _turn_rewards(result.value, len(record.calls))
        outside = sum(r for i, r in enumerate(rewards) if i not in chain)
        traj.rewards = [rewards[i] for i in chain]
        traj.rewards[-1] += outside  # γ = 1: the episode's return is kept on its trained segment
        traj.terminated = result is not TIMEOUT  # cut by its time limit: truncated, as by a turn limit
        traj.segments, traj.error = len(chains), error
        return Episode(traj, len(chains), error)


TIMEOUT = object()


@dataclass
class _Returned:
    value: object


async def _async_run(agent, client, row: dict):
    async with client:
        return await agent(client, row)


def _turn_rewards(value, calls: int) -> tuple[list[float], str | None]:
    """An agent's return as one reward per call: a number on the last call, or one number per call."""
    values = list(value) if isinstance(value, (list, tuple)) else None
    if values is None:
        values = [0.0] * (calls - 1) + [value]
    elif len(values) != calls:
        return [0.0] * calls, f"the agent returned {len(values)} rewards for its {calls} calls; return one per call, or one number"
    for v in values:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            return [0.0] * calls, (f"the agent returned {v!r} as a reward; return a finite number, or one per call")
    return [float(v) for v in values], None
