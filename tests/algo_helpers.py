"""Shared helpers for the algorithm tests: float64 shorthand, random masks and padded-position garbage."""

from __future__ import annotations

import torch

F64 = torch.float64
GARBAGE = (1e30, float("nan"), float("inf"), float("-inf"), -1e30, 7.5)


def rand_mask(B: int, T: int, g: torch.Generator, min_len: int = 1) -> torch.Tensor:
    """Right-padded ``(B, T)`` bool mask with lengths in [min_len, T]; row 0 is full length."""
    lengths = torch.randint(min_len, T + 1, (B,), generator=g)
    lengths[0] = T
    return torch.arange(T).unsqueeze(0) < lengths.unsqueeze(1)


def garble(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Detached copy of ``x`` with huge numbers, NaN and ±inf in every padded position."""
    out = x.detach().clone()
    for k, idx in enumerate((~mask.bool()).nonzero().tolist()):
        out[tuple(idx)] = GARBAGE[k % len(GARBAGE)]
    return out
