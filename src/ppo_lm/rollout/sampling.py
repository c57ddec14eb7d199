"""KV-cached autoregressive sampling for rollouts (SPEC §1.1).

One prefill over the left-padded prompts, then one single-token forward per step with a KV cache.
Sequences that stop leave the decode batch (their cache rows are dropped), so the cost of a step
follows the number of still-running sequences, not the batch size.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from ..models.hf_compat import cache_kwarg, new_cache
from ..models.logprobs import position_ids_from_mask


@dataclass
class SamplingParams:
    max_new_tokens: int
    temperature: float = 1.0  # 0 = greedy
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # 1 = off
    stop_token_ids: tuple[int, ...] = ()
    min_new_tokens: int = 0  # stop tokens are masked out before this many tokens


@dataclass
class Generation:
    """responses (B, T) padded with ``pad_token_id``; mask (B, T) right-padded, including the stop
    token; terminated (B,) True when a stop token ended the response."""

    responses: Tensor
    mask: Tensor
    terminated: Tensor


def filter_logits(logits: Tensor, top_k: int, top_p: float) -> Tensor:
    """Top-k then nucleus (top-p) filtering of (N, V) logits; removed entries become −inf."""
    if top_k and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        cum = sorted_logits.softmax(-1).cumsum(-1)
        # keep the smallest prefix whose mass reaches top_p (the first token always stays)
        drop_sorted = (cum - sorted_logits.softmax(-1)) >= top_p
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def sample_next(logits: Tensor, params: SamplingParams, generator: torch.Generator | None) -> Tensor:
    """(N, V) next-token logits → (N,) token ids."""
    if params.temperature == 0:
        return logits.argmax(-1)
    logits = filter_logits(logits.float() / params.temperature, params.top_k, params.top_p)
    probs = logits.softmax(-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


@torch.no_grad()
def generate(
    lm: nn.Module,
    prompt_ids: Tensor,
    prompt_mask: Tensor,
    params: SamplingParams,
    *,
    pad_token_id: int,
    generator: torch.Generator | None = None,
) -> Generation:
    """Sample responses for left-padded prompts (B, P) with a causal LM.

    Returns a :class:`Generation` whose width T is the longest response (≤ ``max_new_tokens``).
    """
    B, P = prompt_ids.shape
    device = prompt_ids.device
    T = params.max_new_tokens
    stop = torch.tensor(list(params.stop_token_ids), device=device, dtype=torch.long)
    responses = torch.full((B, T), pad_token_id, dtype=torch.long, device=device)
    lengths = torch.full((B,), T, dtype=torch.long, device=device)
    terminated = torch.zeros(B, dtype=torch.bool, device=device)

    cache = new_cache(lm)
    ckw = cache_kwarg(type(lm))
    attn = torch.zeros(B, P + T, dtype=prompt_mask.dtype, device=device)
    attn[:, :P] = prompt_mask
    logits = lm(
        input_ids=prompt_ids,
        attention_mask=prompt_mask,
        position_ids=position_ids_from_mask(prompt_mask),
        use_cache=True,
        logits_to_keep=1,
        **{ckw: cache},
    ).logits[:, -1]
    next_pos = prompt_mask.long().sum(-1)  # (B,)
    alive = torch.arange(B, device=device)  # original row of each decode-batch row
    for t in range(T):
        if t < params.min_new_tokens and stop.numel():
            logits = logits.index_fill(-1, stop, float("-inf"))
        tokens = sample_next(logits, params, generator)
        responses[alive, t] = tokens
        attn[alive, P + t] = 1
        if stop.numel():
            done = torch.isin(tokens, stop)
            if bool(done.any()):
                rows = alive[done]
                lengths[rows] = t + 1
                terminated[rows] = True
                keep = (~done).nonzero().squeeze(-1)
                if keep.numel() == 0:
                    break
                alive, tokens, next_pos = alive[keep], tokens[keep], next_pos[keep]
                cache.batch_select_indices(keep)
        if t == T - 1:
            break
        logits = lm(
            input_ids=tokens.unsqueeze(-1),
            attention_mask=attn[alive, : P + t + 1],
            position_ids=next_pos.unsqueeze(-1),
            use_cache=True,
            **{ckw: cache},
        ).logits[:, -1]
        next_pos = next_pos + 1
    width = int(lengths.max()) if B else 0
    mask = torch.arange(width, device=device).unsqueeze(0) < lengths.unsqueeze(1)
    responses = responses[:, :width].masked_fill(~mask, pad_token_id)
    return Generation(responses=responses, mask=mask, terminated=terminated)
