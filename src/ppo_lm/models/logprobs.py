"""Log-probabilities of chosen tokens without materialising a full (…, V) log-softmax tensor."""

from __future__ import annotations

import torch
from torch import Tensor


def gather_logprobs(logits: Tensor, labels: Tensor) -> Tensor:
    """log softmax(logits)[labels] = logits[labels] − logsumexp(logits).

    Args:
        logits: (..., V), any float dtype (computed in fp32 when half precision).
        labels: (...) token ids.
    Returns:
        (...) fp32 (or fp64 if ``logits`` is fp64) log-probabilities.
    """
    if logits.dtype in (torch.float16, torch.bfloat16):
        logits = logits.float()
    picked = logits.gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    return picked - torch.logsumexp(logits, dim=-1)


def position_ids_from_mask(attention_mask: Tensor) -> Tensor:
    """Positions that skip left padding: (B, L) mask → (B, L) ids, 0 on pads."""
    return (attention_mask.long().cumsum(-1) - 1).clamp_min(0)
