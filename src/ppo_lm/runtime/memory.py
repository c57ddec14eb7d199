"""Memory the process holds but does not use, given back to the OS between the phases of an iteration."""

from __future__ import annotations

import ctypes
import ctypes.util
import sys


def _malloc_trim():
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError, TypeError):
        return None  # not glibc (macOS, musl): nothing to trim


_TRIM = _malloc_trim() if sys.platform.startswith("linux") else None

RELEASE_MIN_BYTES = 256 * 2**20
"""Parameters (trained and frozen) of the policy and the critic above which the trainer gives freed
memory back before each update. Below it the models' whole working set is small, the update re-faults
the pages a trim gave back, and that cost the tiny models more time than the memory it saved
(docs/benchmarks.md has the figures and their host)."""


def release_pays(*models) -> bool:
    """Whether :func:`release_free_memory` before each update is worth its time: when the models'
    parameters (each once, trained or frozen: a LoRA policy counts its base) exceed
    :data:`RELEASE_MIN_BYTES`."""
    params = {id(p): p for m in models if m is not None for p in m.parameters()}
    return sum(p.numel() * p.element_size() for p in params.values()) > RELEASE_MIN_BYTES


def release_free_memory() -> bool:
    """Give the free memory glibc's arenas hold back to the OS (``malloc_trim(0)``: every arena, the
    CPU lanes' own included; tensors below its mmap threshold, up to 32 MiB, live in the arenas).
    Freed tensors otherwise stay resident as holes the next phase's tensors of other sizes do not fit
    (the W3 breakdown in docs/benchmarks.md), and a lane's arena is reused by its thread only.
    Called between phases, so the next one starts from what is in use. False where unavailable."""
    if _TRIM is None:
        return False
    _TRIM(0)
    return True
