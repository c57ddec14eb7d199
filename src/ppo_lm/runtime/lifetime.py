"""Processes that end with the one that started them, so a killed run leaves nothing running that
still writes its folder or holds its memory."""

from __future__ import annotations

import os
import signal


def die_with_parent() -> bool:
    """Linux: ask the kernel to SIGKILL this process when its parent dies (``PR_SET_PDEATHSIG``).
    Returns False where the platform has no such request. A parent already gone by the time of the
    request (this process was handed to init) ends this process at once."""
    try:
        import ctypes

        if ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL) != 0:  # PR_SET_PDEATHSIG
            return False
    except (OSError, AttributeError):
        return False
    if os.getppid() == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    return True


def launched_by_torchrun() -> bool:
    """torchrun's agent sets TORCHELASTIC_RUN_ID in every rank it starts."""
    return "TORCHELASTIC_RUN_ID" in os.environ
