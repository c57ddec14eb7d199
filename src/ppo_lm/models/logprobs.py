"""Log-probabilities of chosen tokens without materialising a full (…, V) log-softmax tensor."""

from __future__ import annotations

import torch
from torch import Tensor


def gather_logprobs(logits: Tensor, labels: Tensor, *, vocab_chunk: int | None = None) -> Tensor:
    """log softmax(logits)[labels] = logits[labels] − logsumexp(logits).

    Args:
        logits: (..., V), any float dtype (computed in fp32 when half precision).
        labels: (...) token ids.
        vocab_chunk: when set, the logsumexp runs over vocabulary chunks of this size, bounding the
            temporary memory for very large vocabularies.
    Returns:
        (...) fp32 (or fp64 if ``logits`` is fp64) log-probabilities.
    """
    if logits.dtype in (torch.float16, torch.bfloat16):
        logits = logits.float()
    picked = logits.gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    if vocab_chunk is None or vocab_chunk >= logits.shape[-1]:
        lse = torch.logsumexp(logits, dim=-1)
    else:
        parts = [torch.logsumexp(c, dim=-1) for c in logits.split(vocab_chunk, dim=-1)]
        lse = torch.logsumexp(torch.stack(parts, -1), dim=-1)
    return picked - lse


def entropy_and_logprobs(logits: Tensor, labels: Tensor) -> tuple[Tensor, Tensor]:
    """(entropy (…), logp of labels (…)) from one log-softmax; used when the entropy is needed anyway."""
    if logits.dtype in (torch.float16, torch.bfloat16):
        logits = logits.float()
    logp_all = torch.log_softmax(logits, dim=-1)
    entropy = -(logp_all.exp() * logp_all).sum(-1)
    return entropy, logp_all.gather(-1, labels.unsqueeze(-1)).squeeze(-1)


def position_ids_from_mask(attention_mask: Tensor) -> Tensor:
    """Positions that skip left padding: (B, L) mask → (B, L) ids, 0 on pads."""
    return (attention_mask.long().cumsum(-1) - 1).clamp_min(0)
