"""Log-probabilities of chosen tokens without materialising a full (…, V) log-softmax tensor."""

from __future__ import annotations

import torch
from torch import Tensor

CHUNK_ELEMENTS = 1 << 22
"""Rows of the (N, V) logits are reduced this many elements (16 MiB of fp32) at a time: the
log-sum-exp's exp, and each step of its backward, then need a chunk of temporary memory instead of
one or two more vocabulary-wide tensors (docs/benchmarks.md, the memory breakdown)."""


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def _float(x: Tensor) -> Tensor:
    return x.to(_compute_dtype(x.dtype))


def _chunks(n_rows: int, width: int):
    step = max(1, CHUNK_ELEMENTS // max(width, 1))
    return (slice(i, min(i + step, n_rows)) for i in range(0, n_rows, step))


def _lse(flat: Tensor) -> Tensor:
    """logsumexp over the last dim of (N, V) ``flat``, a chunk of rows at a time (in fp32 for half)."""
    out = torch.empty(flat.shape[0], dtype=_compute_dtype(flat.dtype), device=flat.device)
    for s in _chunks(*flat.shape):
        out[s] = torch.logsumexp(_float(flat[s]), dim=-1)
    return out


class _GatherLogprobs(torch.autograd.Function):
    """logits[labels] − logsumexp(logits) over (N, V) rows; backward g·(onehot − softmax), built
    in the one (N, V) gradient tensor it returns (autograd's version allocates the softmax, a
    zero tensor for the gather and their sum). Same numbers as the unchunked expression."""

    @staticmethod
    def forward(ctx, flat: Tensor, labels: Tensor) -> Tensor:
        lse = _lse(flat)
        ctx.save_for_backward(flat, labels, lse)
        return _float(flat.gather(1, labels.unsqueeze(1)).squeeze(1)) - lse

    @staticmethod
    def backward(ctx, g: Tensor):
        flat, labels, lse = ctx.saved_tensors
        # (half logits: summed in fp32 and rounded once, as the reference's .float() does)
        grad = torch.empty(flat.shape, dtype=lse.dtype, device=flat.device)
        for s in _chunks(*flat.shape):
            # (−g)·exp(x − lse), as autograd computes logsumexp's backward under the subtraction
            torch.sub(_float(flat[s]), lse[s, None], out=grad[s]).exp_().mul_(-g[s, None])
        grad.scatter_add_(1, labels.unsqueeze(1), g.unsqueeze(1).to(grad.dtype))
        return grad.to(flat.dtype), None


def gather_logprobs(logits: Tensor, labels: Tensor) -> Tensor:
    """log softmax(logits)[labels] = logits[labels] − logsumexp(logits).

    Args:
        logits: (..., V), any float dtype (computed in fp32 when half precision).
        labels: (...) token ids.
    Returns:
        (...) fp32 (or fp64 if ``logits`` is fp64) log-probabilities.
    """
    V = logits.shape[-1]
    flat, flat_labels = logits.reshape(-1, V), labels.reshape(-1)
    if torch.is_grad_enabled() and logits.requires_grad:
        out = _GatherLogprobs.apply(flat, flat_labels)
    else:
        out = _float(flat.gather(1, flat_labels.unsqueeze(1)).squeeze(1)) - _lse(flat)
    return out.view(labels.shape)


def position_ids_from_mask(attention_mask: Tensor) -> Tensor:
    """Positions that skip left padding: (B, L) mask → (B, L) ids, 0 on pads."""
    return (attention_mask.long().cumsum(-1) - 1).clamp_min(0)
