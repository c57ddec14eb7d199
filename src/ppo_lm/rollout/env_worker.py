"""The process an environment's instances live in (docs/environments.md, "Where the environment
runs"): ``python -m ppo_lm.rollout.env_worker FD PARENT_PID``, served by
:class:`~ppo_lm.rollout.env_pool.EnvPool` over the socket ``FD``. It loads the environment class once,
then answers one request at a time — construct, reset, step, drop — so the pool can time each call
and kill this process (and its process group: tool calls, anything the environment started) at the
limit. Imports no torch: a worker starts in a fraction of a second unless the environment imports it.

Requests and replies are pickled tuples: ``("load", spec, sys_path)``, ``("new", eid)``,
``("reset", eid, row, seed, sample, row_index)``, ``("step", eid, text)``, ``("drop", eids)``; the
reply is ``("ok", value)`` or ``("error", one line)``; ``drop`` has none.
"""

from __future__ import annotations

import os
import signal
import sys
from multiprocessing.connection import Connection

from .environment import EnvError, call_user, check_reset, check_step, load_env, takes_sample


class Host:
    """The environment instances of one worker, by episode id."""

    def __init__(self, spec: str):
        try:
            self.cls = load_env(spec)
        except ValueError as e:
            raise EnvError(str(e)) from None
        self.sample_kw = takes_sample(self.cls)
        self.envs: dict[int, object] = {}
        self._schemas: dict[tuple, tuple] = {}
        tools = getattr(self.cls, "tools", None)
        if isinstance(tools, (list, tuple)):  # now, so transformers' import does not count against a reset
            self.schemas(tools)

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

    def schemas(self, tools) -> list | None:
        if not tools:
            return None
        key = tuple(id(t) for t in tools)
        if key not in self._schemas:
            from .tools import tool_schemas

            self._schemas[key] = (tuple(tools), tool_schemas(list(tools)))  # the tools kept: their ids stay theirs
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
                host.envs.pop(eid, None)
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
        try:
            conn.send(reply)
        except Exception as e:  # noqa: BLE001 (pickling what the user's code returned)
            conn.send(("error", f"the environment's {kind} returned something that cannot be sent to the trainer "
                                f"({type(e).__name__}: {e}); return str, lists and dicts of str, numbers, bools"))


def die_with_parent(parent: int) -> None:
    """Linux: the kernel kills this process when the trainer dies (even by SIGKILL), so no worker
    outlives its run; elsewhere a dead trainer closes the socket, which ends :func:`serve`."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:  # the trainer died before the line above
        os._exit(1)


def main(argv: list[str]) -> None:
    fd, parent = int(argv[1]), int(argv[2])
    die_with_parent(parent)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the trainer's to handle; it closes the pool
    serve(Connection(fd))


if __name__ == "__main__":
    main(sys.argv)
