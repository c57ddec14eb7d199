"""Processes that end with the one that started them, so a killed run leaves nothing running that
still writes its folder or holds its memory."""

from __future__ import annotations

import os
import signal


def die_with_parent(parent: int | None = None) -> bool:
    """Linux: ask the kernel to SIGKILL this process when its parent dies (``PR_SET_PDEATHSIG``).
    Returns False where the platform has no such request. ``parent``: the pid that started this process
    (a forking caller knows it; default: the parent now). A parent gone by the time the request took
    (this process was handed to another) ends this process at once."""
    if parent is None:
        parent = os.getppid()  # (not "is it 1": a launcher may itself be a container's first process)
    try:
        import ctypes

        if ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL) != 0:  # PR_SET_PDEATHSIG
            return False
    except (OSError, AttributeError):
        return False
    if os.getppid() != parent:  # it died before the request: this process was handed on
        os.kill(os.getpid(), signal.SIGKILL)
    return True


def launched_by_torchrun() -> bool:
    """torchrun's agent sets TORCHELASTIC_RUN_ID in every rank it starts."""
    return "TORCHELASTIC_RUN_ID" in os.environ
