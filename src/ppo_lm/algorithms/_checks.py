"""Argument validation shared by the algorithm functions.

Errors are raised early as ``ValueError`` naming the offending argument, so a bad call fails at
its first use rather than producing silently wrong advantages.
"""

from __future__ import annotations

import torch
from torch import Tensor


def check_same_shape(ref_name: str, ref: Tensor, **others: Tensor | None) -> None:
    if ref.dim() != 2:
        raise ValueError(f"`{ref_name}` must be a (B, T) tensor, got shape {tuple(ref.shape)}")
    for name, t in others.items():
        if t is not None and t.shape != ref.shape:
            raise ValueError(
                f"`{name}` has shape {tuple(t.shape)} but `{ref_name}` has shape {tuple(ref.shape)}; "
                "all per-token tensors must be (B, T) over the same response positions"
            )


def check_mask(mask: Tensor) -> Tensor:
    """Return ``mask`` as bool after checking it is 0/1 and right-padded (valid tokens a prefix)."""
    if mask.dtype != torch.bool:
        if not bool(((mask == 0) | (mask == 1)).all()):
            raise ValueError("`mask` must contain only 0 and 1")
        mask = mask.bool()
    if mask.shape[-1] > 1 and bool((mask[:, 1:] & ~mask[:, :-1]).any()):
        raise ValueError(
            "`mask` must be right-padded: the valid tokens of each row must be a prefix "
            "(found a valid token after a padding position)"
        )
    return mask


def check_unit_interval(name: str, value: float | Tensor) -> None:
    if isinstance(value, Tensor):
        bad = bool(((value < 0) | (value > 1) | ~torch.isfinite(value)).any())
    else:
        bad = not (0.0 <= float(value) <= 1.0)
    if bad:
        raise ValueError(f"`{name}` must lie in [0, 1], got {value}")


def check_positive(name: str, value: float | None) -> None:
    if value is not None and not float(value) > 0:
        raise ValueError(f"`{name}` must be > 0, got {value}")


def check_group_size(n: int, group_size: int, minimum: int = 1) -> None:
    if not isinstance(group_size, int) or group_size < minimum:
        raise ValueError(f"`group_size` must be an integer >= {minimum}, got {group_size}")
    if n % group_size:
        raise ValueError(
            f"`group_size`={group_size} does not divide the number of scores ({n}); scores must be "
            "laid out group-contiguous [p0s0, p0s1, ..., p1s0, ...]"
        )
