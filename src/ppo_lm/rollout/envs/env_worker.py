"""The process an environment's instances live in (docs/environments.md, "Where the environment
runs"): started by :class:`~ppo_lm.rollout.envs.env_pool.EnvPool` through :mod:`ppo_lm.runtime.child`,
which also ends it with the trainer. It loads the environment class once,
then answers one request at a time — construct, reset, step, drop — so the pool can time each call
and kill this process (and its process group: tool calls, anything the environment started) at the
limit. Imports no torch: a worker starts in a fraction of a second unless the environment imports it.

Requests and replies are pickled tuples: ``("load", spec, sys_path)``, ``("new", eid)``,
``("reset", eid, row, seed, sample, row_index)``, ``("step", eid, text)``, ``("drop", eids)``; the
reply is ``("ok", value)`` or ``("error", one line)``; ``drop`` has none.
"""

from __future__ import annotations

import contextlib
import sys
from multiprocessing.connection import Connection

from . import tools
from .environment import EnvError, EnvSpec, call_user, check_reset, check_step, load_env, takes_sample


class Host:
    """The environment instances of one worker, by episode id."""

    def __init__(self, spec: EnvSpec):
        try:
            self.cls = load_env(spec)
        except ValueError as e:
            raise EnvError(str(e)) from None
        self.sample_kw = takes_sample(self.cls)
        self.envs: dict[int, object] = {}
        self._schemas: dict[tuple, tuple] = {}
        offered = getattr(self.cls, "tools", None)
        if isinstance(offered, (list, tuple)):  # now, so transformers' import does not count against a reset
            self.schemas(offered)

    def new(self, eid: int) -> None:
        self.envs[eid] = call_user(self.cls, what="constructor")

    def reset(self, eid: int, row: dict, seed: int, sample: int, row_index: int):
        """The first prompt and the JSON schemas of the instance's tools (None without tools)."""
        env = self.envs[eid]
        kw = {"sample": sample} if self.sample_kw else {}
        first = check_reset(call_user(env.reset, row, seed, what="reset", **kw), row_index)
        return first, self.schemas(getattr(env, "tools", None))

    def step(self, eid: int, text: str):
        return check_step(call_user(self.envs[eid].step, text, what="step"))

    def schemas(self, offered) -> list | None:
        """The JSON schemas of the functions an instance offers, built once per list of functions."""
        if not offered:
            return None
        key = tuple(id(t) for t in offered)
        if key not in self._schemas:  # the functions kept with their schemas: their ids stay theirs
            self._schemas[key] = (tuple(offered), tools.tool_schemas(list(offered)))
        return self._schemas[key][1]


def serve(conn: Connection) -> None:
    """Answer requests until the pool closes the socket."""
    host = None
    while True:
        try:
            request = conn.recv()
        except (EOFError, OSError):
            return
        kind, args = request[0], request[1:]
        if kind == "drop":
            for eid in args[0]:
                env = host.envs.pop(eid, None)
                with contextlib.suppress(Exception):  # a session's end (an OpenEnv server's slot); best effort
                    getattr(env, "close", lambda: None)()
            continue
        try:
            if kind == "load":
                sys.path[:0] = [p for p in args[1] if p not in sys.path]
                host, value = Host(args[0]), None
            else:
                value = getattr(host, kind)(*args)
            reply = ("ok", value)
        except EnvError as e:
            reply = ("error", str(e))
        sys.stdout.flush()  # what the environment printed reaches the log before the trainer's next line
        try:
            conn.send(reply)
        except OSError:  # the trainer closed the pool (or ended): nothing is waiting for the reply
            return
        except Exception as e:  # noqa: BLE001 (pickling what the user's code returned)
            with contextlib.suppress(OSError):
                conn.send(("error", f"the environment's {kind} returned something that cannot be sent to the "
                                    f"trainer ({type(e).__name__}: {e}); return str, lists and dicts of str, numbers, "
                                    "bools"))


SERVING = False
"""True in a worker: a module the worker imports that starts a training run is refused (it would start
workers of its own, and so on)."""


def child_main(conn: Connection, groups: int) -> None:
    """The worker (started by :func:`ppo_lm.runtime.child.start`): ``groups`` tells its watchdog of tool
    calls' process groups (:data:`ppo_lm.rollout.envs.tools.GROUPS`)."""
    global SERVING
    SERVING = True
    tools.GROUPS = groups
    # (a terminal's Ctrl-C reaches the trainer only: the worker has a session of its own; the trainer
    # then closes the pool. The environment's own processes keep SIGINT as Python gives it.)
    serve(conn)
