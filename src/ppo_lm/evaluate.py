"""Greedy evaluation of a policy with a verifier (held-out accuracy for the demo and eval hooks)."""

from __future__ import annotations

import torch
from torch import nn

from .rollout.reward import Verifier, score_with_verifier
from .rollout.sampling import SamplingParams, generate
from .rollout.text import encode_prompts, response_texts


@torch.no_grad()
def greedy_eval(
    lm: nn.Module,
    tokenizer,
    rows: list[dict],
    verifier: Verifier,
    *,
    max_new_tokens: int,
    prompt_column: str = "prompt",
    batch_size: int = 256,
) -> tuple[float, list[str]]:
    """Mean verifier score of greedy responses to ``rows`` and the responses themselves."""
    was_training = lm.training
    lm.eval()
    device = next(lm.parameters()).device
    params = SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0, stop_token_ids=(tokenizer.eos_token_id,))
    responses: list[str] = []
    scores: list[float] = []
    for i in range(0, len(rows), batch_size):
        chunk = rows[i : i + batch_size]
        prompts = [r[prompt_column] for r in chunk]
        ids, mask = encode_prompts(tokenizer, prompts)
        gen = generate(lm, ids.to(device), mask.to(device), params, pad_token_id=tokenizer.pad_token_id)
        texts = response_texts(tokenizer, gen)
        columns = {k: [r[k] for r in chunk] for k in chunk[0] if k != prompt_column}
        scores += score_with_verifier(verifier, prompts, texts, columns).tolist()
        responses += texts
    lm.train(was_training)
    return (sum(scores) / len(scores) if scores else float("nan")), responses
