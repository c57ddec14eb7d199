"""Child processes (ppo_lm.runtime.child) end with their parent however it ends, and take what they
started with them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ppo_lm.runtime import child

HERE = Path(__file__).parent


def _gone(pid: int, within: float = 5.0) -> bool:
    """``pid`` no longer runs (a zombie counts as gone: its parent may not have reaped it yet)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    return True
        except FileNotFoundError:
            return True
        time.sleep(0.02)
    return False


@pytest.fixture
def on_path(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]))


def test_a_sigkilled_parent_takes_its_child_and_what_the_child_started(on_path):
    from child_helpers import PARENT

    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True)
    try:
        pids = [int(x) for x in parent.stdout.readline().split()]
        assert len(pids) == 3 and all(not _gone(p, 0.1) for p in pids)
    finally:
        parent.kill()
        parent.wait()
    assert all(_gone(p) for p in pids), pids


@pytest.mark.parametrize("what", ["plain", "ignore-term", "kill-watchdog"])
def test_stop_ends_a_child_whatever_it_does(on_path, what):
    """Closing the pipe ends the child at once; a child that ignores SIGTERM goes too; one whose
    watchdog is gone is killed from the parent's side once the grace has passed."""
    c = child.start("child_helpers")
    c.conn.send(what)
    same, apart = c.conn.recv()
    t0 = time.monotonic()
    assert child.stop([c], grace_s=1.0) == [-signal.SIGKILL]
    took = time.monotonic() - t0
    assert took < (3.0 if what == "kill-watchdog" else 0.9), took
    assert _gone(same)
    if what != "kill-watchdog":  # a group the watchdog was told of: only the watchdog knew it
        assert _gone(apart)
    else:
        os.kill(apart, signal.SIGKILL)
    c.conn.close()



@pytest.mark.parametrize("given, lives", [(None, True), ("other", False)])
def test_die_with_parent_keeps_a_child_of_a_live_parent_and_ends_one_already_handed_on(given, lives):
    """The parent is the one that started the process, whatever its pid (a container's first process
    is pid 1); a process whose named parent is no longer its parent ends at once."""
    code = ("import os, sys; from ppo_lm.runtime.lifetime import die_with_parent; "
            "arg = None if sys.argv[1] == 'None' else os.getppid() + 10**6; "
            "print(die_with_parent(arg), flush=True)")
    proc = subprocess.run([sys.executable, "-c", code, str(given)], capture_output=True, text=True, timeout=60)
    if lives:
        assert proc.returncode == 0 and proc.stdout.strip() == "True", proc.stderr
    else:
        assert proc.returncode == -signal.SIGKILL and proc.stdout == ""
