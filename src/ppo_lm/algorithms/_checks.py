"""Argument validation shared by the algorithm functions and the trainer's start-up checks.

Errors are raised early naming the offending argument (``ValueError``, or the ``error`` class the
caller passes, e.g. the trainer's ``ConfigError``), so a bad call fails at its first use rather than
producing silently wrong advantages.

Checks of tensor *values* (a mask's 0/1 entries and right padding, λ tensors in [0, 1], empty rows)
read the tensor back to the host. A caller that has already checked its data once — the trainer
checks each rollout at its boundary — runs the algorithm functions inside
:func:`assume_valid_masks`, so the hot path (every micro-batch's loss) does not sync for them.
"""

from __future__ import annotations

import contextlib

import torch
from torch import Tensor

_check_values = True  # process-wide (not thread-local): CPU lanes run the losses on worker threads


@contextlib.contextmanager
def assume_valid_masks():
    """Skip the value checks of masks and tensors for the duration (shapes are still checked)."""
    global _check_values
    before, _check_values = _check_values, False
    try:
        yield
    finally:
        _check_values = before


def checking_values() -> bool:
    """False inside :func:`assume_valid_masks`."""
    return _check_values


def check_same_shape(ref_name: str, ref: Tensor, **others: Tensor | None) -> None:
    if ref.dim() != 2:
        raise ValueError(f"`{ref_name}` must be a (B, T) tensor, got shape {tuple(ref.shape)}")
    for name, t in others.items():
        if t is not None and t.shape != ref.shape:
            raise ValueError(
                f"`{name}` has shape {tuple(t.shape)} but `{ref_name}` has shape {tuple(ref.shape)}; "
                "all per-token tensors must be (B, T) over the same response positions"
            )


def check_mask(mask: Tensor, *, always: bool = False, right_padded: bool = True) -> Tensor:
    """Return ``mask`` as bool after checking it is 0/1 and, with ``right_padded``, right-padded (valid
    tokens a prefix; the scans of GAE and returns-to-go need it, :func:`~.registry.compute_advantages`
    compacts a mask with holes for them); inside :func:`assume_valid_masks` only when ``always``.
    Masked sums and means (losses, whitening, statistics) take any 0/1 mask: a multi-turn episode's
    action tokens with its observation tokens between them as holes."""
    check = _check_values or always
    if mask.dtype != torch.bool:
        if check and not bool(((mask == 0) | (mask == 1)).all()):
            raise ValueError("`mask` must contain only 0 and 1")
        mask = mask.bool()
    if check and right_padded and mask.shape[-1] > 1 and bool((mask[:, 1:] & ~mask[:, :-1]).any()):
        raise ValueError(
            "`mask` must be right-padded: the valid tokens of each row must be a prefix "
            "(found a valid token after a padding position)"
        )
    return mask


def check_response_mask(mask: Tensor, action_mask: Tensor | None = None) -> None:
    """What the trainer checks once per rollout before running the algorithm functions inside
    :func:`assume_valid_masks`: a right-padded (B, T) mask with at least one valid token per row
    (the token that carries the score); a multi-turn ``action_mask`` within it, with at least one
    action token per row."""
    m = check_mask(mask, always=True)
    if m.dim() != 2 or bool((m.sum(1) == 0).any()):
        raise ValueError("`response_mask` must be (B, T) with at least one valid token in every row")
    if action_mask is not None:
        a = check_mask(action_mask, always=True, right_padded=False)
        if a.shape != m.shape or bool((a & ~m).any()) or bool((a.sum(1) == 0).any()):
            raise ValueError("`action_mask` must be (B, T) within `response_mask`, with at least one action token "
                             "in every row")


def check_unit_interval(name: str, value: float | Tensor | None, *, open_low: bool = False,
                        error: type[Exception] = ValueError) -> None:
    """``value`` in [0, 1] ((0, 1] with ``open_low``); None passes."""
    if value is None:
        return
    if isinstance(value, Tensor):
        if not _check_values:
            return
        low_bad = (value <= 0) if open_low else (value < 0)
        bad = bool((low_bad | (value > 1) | ~torch.isfinite(value)).any())
    else:
        bad = not (0.0 < float(value) <= 1.0 if open_low else 0.0 <= float(value) <= 1.0)
    if bad:
        raise error(f"`{name}` must lie in {'(0, 1]' if open_low else '[0, 1]'}, got {value}")


def check_positive(name: str, value: float | None, *, allow_zero: bool = False,
                   error: type[Exception] = ValueError) -> None:
    """``value`` > 0 (>= 0 with ``allow_zero``); None passes."""
    if value is not None and not (float(value) >= 0 if allow_zero else float(value) > 0):
        raise error(f"`{name}` must be {'>= 0' if allow_zero else '> 0'}, got {value}")


def check_group_size(n: int, group_size: int, minimum: int = 1) -> None:
    if not isinstance(group_size, int) or group_size < minimum:
        raise ValueError(f"`group_size` must be an integer >= {minimum}, got {group_size}")
    if n % group_size:
        raise ValueError(
            f"`group_size`={group_size} does not divide the number of scores ({n}); scores must be "
            "laid out group-contiguous [p0s0, p0s1, ..., p1s0, ...]"
        )
