"""The process an environment's instances live in (docs/environments.md, "Where the environment
runs"): started by :class:`~ppo_lm.rollout.env_pool.EnvPool` (:data:`BOOT`) and served over the socket
``FD``. It loads the environment class once,
then answers one request at a time — construct, reset, step, drop — so the pool can time each call
and kill this process (and its process group: tool calls, anything the environment started) at the
limit. Imports no torch: a worker starts in a fraction of a second unless the environment imports it.

Requests and replies are pickled tuples: ``("load", spec, sys_path)``, ``("new", eid)``,
``("reset", eid, row, seed, sample, row_index)``, ``("step", eid, text)``, ``("drop", eids)``; the
reply is ``("ok", value)`` or ``("error", one line)``; ``drop`` has none.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import sys
from multiprocessing.connection import Connection

from . import tools
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


def watch(death: int, socket_fd: int) -> int:
    """Fork the worker's watchdog: a process that waits for the trainer's end — EOF on ``death``, the
    read end of a pipe only the trainer writes to, closed when the trainer closes the pool or dies,
    even by SIGKILL — and then kills every tool call's process group it was told of and this worker's
    whole process group (itself, the worker, whatever the environment started). Returns the write end
    of the pipe that tells it of tool calls' groups ("+pgid" / "-pgid" lines). It lets go of the
    worker's socket, so the trainer sees the worker's own end at once."""
    read, write = os.pipe()
    if os.fork():
        os.close(read)
        os.close(death)
        return write
    os.close(write)
    os.close(socket_fd)
    groups: set[int] = set()
    pending = b""
    poller = select.poll()  # (not select: the trainer's descriptor numbers may be 1024 and above)
    for fd in (death, read):
        poller.register(fd, select.POLLIN | select.POLLHUP | select.POLLERR)
    while True:
        ready = {fd for fd, _ in poller.poll()}
        if death in ready:
            break
        chunk = os.read(read, 4096)
        if not chunk:  # the worker ended: its group goes when the trainer's pipe closes
            poller.unregister(read)
            continue
        pending += chunk
        *lines, pending = pending.split(b"\n")
        for line in lines:
            (groups.add if line[:1] == b"+" else groups.discard)(int(line[1:]))
    for group in groups:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(group, signal.SIGKILL)
    os.killpg(0, signal.SIGKILL)
    os._exit(0)  # not reached


SERVING = False
"""True in a worker: a module the worker imports that starts a training run is refused (it would start
workers of its own, and so on)."""


def main(argv: list[str]) -> None:
    global SERVING
    SERVING = True
    fd, death = int(argv[1]), int(argv[2])
    tools.GROUPS = watch(death, fd)
    # (a terminal's Ctrl-C reaches the trainer only: the worker has a session of its own; the trainer
    # then closes the pool. The environment's own processes keep SIGINT as Python gives it.)
    serve(Connection(fd))


BOOT = ("import sys; sys.path[:1] = []; root = sys.argv.pop(); "
        "root in sys.path or sys.path.insert(0, root); "
        "from ppo_lm.rollout.env_worker import main; main(sys.argv)")
"""The worker's command line (``python -u -c BOOT FD DEATH_FD PACKAGE_ROOT``): without the current
directory at the front of the import path (`python -m` would put it there, and a file named like a
module of the standard library there would shadow it in the worker only), ppo_lm imported from where
the trainer imported it (its folder put first unless it is on the path already: a checkout the trainer
put on its path wins over an installed copy), the trainer's environment variables as they are."""
