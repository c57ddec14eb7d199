"""Where a user's environment runs (docs/environments.md, "Where the environment runs"): instances
in worker processes (:mod:`ppo_lm.rollout.envs.env_worker`), each call timed by this side and its worker
killed at ``rollout.env_timeout_s`` — code blocked in C included, from any thread, with tool calls'
own limits nested inside (a step's limit bounds its tool calls together). The episodes of a batch are
spread over the workers, so their environments step in parallel.

A call past its limit, an environment that raises or returns the wrong types, a worker that dies:
one :class:`~ppo_lm.rollout.envs.environment.EnvError` line; the pool then stops every worker (the run is
over) and starts fresh ones if it is used again.
"""

from __future__ import annotations

import contextlib
import functools
import sys
import threading
import time
import weakref
from collections import deque
from dataclasses import dataclass
from multiprocessing.connection import wait

from ...runtime import child
from .environment import EnvError, EnvSpec

LOAD_TIMEOUT_S = 120.0
"""Seconds a worker may take to start and import the environment's module (a module that imports
torch or a simulator takes seconds; ``rollout.env_timeout_s`` is for the calls)."""


@dataclass
class Started:
    """An episode's environment after ``reset``: its id in the pool, the first prompt, and the JSON
    schemas of its tools for the chat template (None without tools)."""

    eid: int
    first: str | list[dict]
    tools: list[dict] | None


def _stop(workers: list[child.Child]) -> None:
    """End every worker (its watchdog kills the tool calls' groups and the worker's own: what its
    environments started goes with it) and close their sockets."""
    child.stop(workers)
    for w in workers:
        w.conn.close()
    workers.clear()


class EnvPool:
    """The instances of one environment class in ``workers`` processes. ``spec``: what
    :func:`~ppo_lm.rollout.envs.environment.load_env` reads (an :class:`EnvSpec`, or its ``'path/env.py:Class'``,
    ``'module:Class'``, ``'builtin:…'`` or ``'openenv+ws://…'``); ``timeout_s``: each call's limit (constructor, reset, step). Workers start on first
    use; :meth:`close` (or the pool's collection, or the interpreter's exit) stops them. One caller at
    a time (a lock keeps it so)."""

    def __init__(self, spec: EnvSpec | str, *, workers: int, timeout_s: float):
        if workers < 1:
            raise ValueError(f"an environment pool needs at least one worker, got {workers}")
        self.spec, self.size, self.timeout_s = spec, workers, timeout_s
        self._workers: list[child.Child] = []
        self._next_eid = 0
        self._lock = threading.Lock()
        self._finalizer = weakref.finalize(self, _stop, self._workers)

    def __reduce__(self):
        """A copy elsewhere (an asynchronous producer's process) is a pool of the same settings, not
        started: its workers are its own."""
        return functools.partial(EnvPool, self.spec, workers=self.size, timeout_s=self.timeout_s), ()

    # ------------------------------------------------------------------------------------------ API
    def start(self, rows: list[dict], seeds: list[int], samples: int) -> list[Started]:
        """``samples`` episodes per row, group-contiguous: constructed, then reset with the row, the
        group's seed ``seeds[row]`` and the episode's index in its group (``sample``)."""
        with self._lock:
            self._ensure_started()
            jobs = [(r, j) for r in range(len(rows)) for j in range(samples)]
            eids = list(range(self._next_eid, self._next_eid + len(jobs)))
            self._next_eid += len(jobs)
            self._call([(e, ("new", e)) for e in eids], "constructor")
            firsts = self._call([(e, ("reset", e, dict(rows[r]), seeds[r], j, r)) for e, (r, j) in zip(eids, jobs)],
                                "reset")
            return [Started(e, first, tools) for e, (first, tools) in zip(eids, firsts)]

    def step(self, turns: list[tuple[int, str]]) -> list[tuple[str | list[dict] | None, float, bool]]:
        """``step(text)`` of each ``(eid, text)``, checked: ``(answer, reward, done)`` in order."""
        with self._lock:
            return self._call([(e, ("step", e, text)) for e, text in turns], "step")

    def drop(self, eids: list[int]) -> None:
        """Forget these episodes' environments (their episodes are over)."""
        with self._lock:
            if not self._workers:  # stopped after a failure: nothing left to forget
                return
            for w, group in self._by_worker(eids).items():
                with contextlib.suppress(OSError):  # a worker gone since: its next call says so
                    self._workers[w].conn.send(("drop", group))

    def open(self) -> None:
        """Start the workers and load the environment in each now (else the first :meth:`start` does)."""
        with self._lock:
            self._ensure_started()

    def close(self) -> None:
        with self._lock:
            _stop(self._workers)

    # ------------------------------------------------------------------------------------- internals
    def _by_worker(self, eids: list[int]) -> dict[int, list[int]]:
        out: dict[int, list[int]] = {}
        for e in eids:
            out.setdefault(e % len(self._workers), []).append(e)
        return out

    def _ensure_started(self) -> None:
        if self._workers:
            return
        for _ in range(self.size):
            self._workers.append(child.start("ppo_lm.rollout.envs.env_worker"))
        paths = [p for p in sys.path if p]
        self._call([(w, ("load", self.spec, paths)) for w in range(self.size)], "module import",
                   limit=(max(LOAD_TIMEOUT_S, self.timeout_s), "starting a worker"))

    def _call(self, calls: list[tuple[int, tuple]], what: str, limit: tuple[float, str] | None = None) -> list:
        """Each ``(eid, request)`` on worker ``eid % workers``, one request at a time per worker, all
        workers at once; each request's limit (seconds, and what sets them: ``rollout.env_timeout_s`` by
        default) runs from when its worker starts it. Replies in order."""
        limit = (self.timeout_s, "rollout.env_timeout_s") if limit is None else limit
        if not self._workers:
            raise EnvError("the environments' workers were stopped (the pool was closed, or an earlier call failed); "
                           "start new episodes")
        queues = {w: deque() for w in range(len(self._workers))}
        for k, (eid, request) in enumerate(calls):
            queues[eid % len(self._workers)].append((k, request))
        out, busy = [None] * len(calls), {}  # busy: worker -> (index of its request, deadline)
        try:
            self._exchange(queues, out, busy, what, limit)
        except BaseException:  # an interrupt, a reply that cannot be read: replies would be left in flight
            _stop(self._workers)
            raise
        return out

    def _exchange(self, queues: dict, out: list, busy: dict, what: str, limit: tuple[float, str]) -> None:
        """Send each worker its next request as it answers the last; fill ``out``; fail at a deadline."""
        def send_next(w: int) -> None:
            if queues[w]:
                k, request = queues[w].popleft()
                try:
                    self._workers[w].conn.send(request)
                except OSError:  # the worker is gone: its exit status says how
                    self._ended(w, what)
                busy[w] = (k, time.monotonic() + limit[0])

        for w in queues:
            send_next(w)
        while busy:
            deadline = min(d for _, d in busy.values())
            conns = {self._workers[w].conn: w for w in busy}
            # (a wait of days overflows poll's milliseconds: wake hourly; a call keeps its own deadline)
            for conn in wait(list(conns), timeout=min(max(0.0, deadline - time.monotonic()), 3600.0)):
                w = conns[conn]
                k, _ = busy.pop(w)
                out[k] = self._reply(w, what)
                send_next(w)
            late = [w for w, (_, d) in busy.items() if d <= time.monotonic()]
            if late:
                self._fail(f"the environment's {what} ran past its time limit of {limit[0]:g} s ({limit[1]}); "
                           "its worker process was stopped")

    def _reply(self, w: int, what: str):
        try:
            status, value = self._workers[w].conn.recv()
        except (EOFError, OSError):
            self._ended(w, what)
        except Exception as e:  # noqa: BLE001 (unpickling: a class that exists only in the worker, …)
            self._fail(f"the environment's {what} returned something the trainer cannot read ({type(e).__name__}: "
                       f"{e}); return str, lists and dicts of str, numbers, bools")
        if status == "error":
            self._fail(value)
        return value

    def _ended(self, w: int, what: str):
        code = self._workers[w].proc.wait()
        how = f"signal {-code}" if code < 0 else f"exit code {code}"
        self._fail(f"the environment's worker process ended ({how}) during its {what}; the environment's own "
                   "output above says why")

    def _fail(self, message: str):
        _stop(self._workers)
        raise EnvError(message)


def check_env(spec: EnvSpec | str, timeout_s: float) -> None:
    """Load ``spec`` in one worker, as a run's pool will — the module imported there, never here; the
    class checked, its tools' schemas built — and stop it: a run's start-up check, before any model
    loads. :class:`EnvError` with the line that says what is wrong."""
    pool = EnvPool(spec, workers=1, timeout_s=timeout_s)
    try:
        pool.open()
    finally:
        pool.close()
