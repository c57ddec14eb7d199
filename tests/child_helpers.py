"""A child for tests/test_child.py, told over its socket what to do, that reports pids back."""

import os
import signal
import subprocess
import time


def child_main(conn, groups):
    what = conn.recv()
    if what == "ignore-term":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    elif what == "kill-watchdog":  # the child's only child is its watchdog
        with open(f"/proc/self/task/{os.getpid()}/children") as f:
            watchdog = int(f.read().split()[0])
        os.kill(watchdog, signal.SIGKILL)
        os.waitpid(watchdog, 0)
    # a process in the child's group, and one in a group of its own that the watchdog is told of
    same = subprocess.Popen(["sleep", "600"])
    apart = subprocess.Popen(["sleep", "600"], start_new_session=True)
    if what != "kill-watchdog":
        os.write(groups, f"+{apart.pid}\n".encode())
    conn.send((same.pid, apart.pid))
    while True:
        time.sleep(1)


PARENT = """
import sys, time
from ppo_lm.runtime import child
c = child.start("child_helpers")
c.conn.send("plain")
print(c.pid, *c.conn.recv(), flush=True)
time.sleep(600)
"""
