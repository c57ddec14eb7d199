"""Child processes that never outlive the one that started them: an environment's worker
(:mod:`ppo_lm.rollout.envs.env_worker`) and an asynchronous producer (:mod:`ppo_lm.rollout.sources.producer_process`)
are both started here, live the same way and stop the same way.

:func:`start` runs ``python -u -c BOOT MODULE FD DEATH_FD PACKAGE_ROOT`` in a session of its own (a
terminal's Ctrl-C reaches the parent only, which then stops its children), with a socket ``FD`` to
talk over and the read end ``DEATH_FD`` of a pipe only the parent holds the write end of. In the
child, :func:`boot` first forks a watchdog that waits for EOF on that pipe — the parent stopped the
child, or died, even by SIGKILL — and then kills every process group it was told of (a tool call's)
and the child's whole group (the child, whatever its code started, itself); then it imports
``MODULE`` and calls its ``child_main(conn, groups)``. The watchdog is a process, not a thread, so a
child stuck in C code holding the interpreter's lock still goes.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import select
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path

PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])
"""The folder ppo_lm is imported from here: a child imports it from the same place."""

BOOT = ("import sys; sys.path[:1] = []; root = sys.argv.pop(); "
        "root in sys.path or sys.path.insert(0, root); "
        "from ppo_lm.runtime.child import boot; boot(sys.argv)")
"""A child's command line: without the current directory at the front of the import path (`python -m`
would put it there, and a file named like a module of the standard library there would shadow it in
the child only), ppo_lm imported from where the parent imported it (its folder put first unless it is
on the path already: a checkout the parent put on its path wins over an installed copy), the parent's
environment variables as they are."""


@dataclass
class Child:
    """A started child: its process, the parent's end of its socket, and the write end of the pipe its
    watchdog waits on (closing it ends the child)."""

    proc: subprocess.Popen
    conn: Connection
    death: int

    @property
    def pid(self) -> int:
        return self.proc.pid


def start(module: str, pass_fds: tuple[int, ...] = ()) -> Child:
    """Start ``module``'s ``child_main`` in a child process; ``pass_fds``: more descriptors it inherits."""
    ours, theirs = socket.socketpair()
    death_read, death_write = os.pipe()  # only this process holds the write end
    try:
        proc = subprocess.Popen(
            [sys.executable, "-u", "-c", BOOT, module, str(theirs.fileno()), str(death_read), PACKAGE_ROOT],
            pass_fds=(theirs.fileno(), death_read, *pass_fds), start_new_session=True)  # its own group: killed whole
    except BaseException:
        os.close(death_write)
        ours.close()
        raise
    finally:
        theirs.close()
        os.close(death_read)
    return Child(proc, Connection(ours.detach()), death_write)


def stop(children: list[Child], grace_s: float = 5.0) -> list[int]:
    """End ``children``: closing each one's pipe makes its watchdog kill its group; a group still there
    after ``grace_s`` seconds (a watchdog gone: the child stopped it, or ran out of memory) is killed from
    here. Reaps them; returns their exit codes. Their sockets stay open: a thread may still read one
    (it sees the end), and the caller closes them."""
    for c in children:
        with contextlib.suppress(OSError):
            os.close(c.death)
    deadline = time.monotonic() + grace_s
    codes = []
    for c in children:
        try:
            codes.append(c.proc.wait(timeout=max(0.0, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(c.proc.pid, signal.SIGKILL)
            codes.append(c.proc.wait())
    return codes


# ---------------------------------------------------------------------------------- the child's side
def boot(argv: list[str]) -> None:
    """The child's entry (:data:`BOOT`): fork the watchdog, then serve ``MODULE``'s ``child_main``; the
    child ends when that returns (or its watchdog kills it)."""
    module, fd, death = argv[1], int(argv[2]), int(argv[3])
    groups = _watch(death)
    try:
        importlib.import_module(module).child_main(Connection(fd), groups)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(0)


def _watch(death: int) -> int:
    """Fork the watchdog (the module docstring). Returns the write end of the pipe that tells it of
    other process groups to kill with the child ("+pgid" / "-pgid" lines). The watchdog lets go of every
    other descriptor, so the parent sees the child's socket end with the child, and nothing the child
    inherited (a shared-memory file) lives on in it."""
    read, write = os.pipe()
    if os.fork():
        os.close(read)
        os.close(death)
        return write
    os.close(write)
    for fd in _open_fds():
        if fd > 2 and fd not in (death, read):
            with contextlib.suppress(OSError):
                os.close(fd)
    groups: set[int] = set()
    pending = b""
    os.set_blocking(read, False)
    poller = select.poll()  # (not select: the parent's descriptor numbers may be 1024 and above)
    for fd in (death, read):
        poller.register(fd, select.POLLIN | select.POLLHUP | select.POLLERR)
    reading = True
    while True:
        ready = {fd for fd, _ in poller.poll()}
        while reading:  # every line written so far, also when the end came at the same time
            try:
                chunk = os.read(read, 4096)
            except BlockingIOError:
                break
            if not chunk:  # the child ended: its group goes when the parent's pipe closes
                poller.unregister(read)
                reading = False
                break
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for line in lines:
                (groups.add if line[:1] == b"+" else groups.discard)(int(line[1:]))
        if death in ready:
            break
    for group in groups:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(group, signal.SIGKILL)
    os.killpg(0, signal.SIGKILL)
    os._exit(0)  # not reached


def _open_fds() -> list[int]:
    try:
        return [int(x) for x in os.listdir("/proc/self/fd")]
    except OSError:  # no /proc: the descriptors a child is usually handed
        return list(range(3, 256))
