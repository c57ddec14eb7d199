"""Between text and tokens at the edges of a rollout: prompts in, responses out — one way for the
rollout, evaluation and the demo, and the same prompt encoding as the SFT and reward-model stages."""

from __future__ import annotations

from torch import Tensor

from .sampling import Generation


def encode_prompts(tokenizer, prompts: list[str]) -> tuple[Tensor, Tensor]:
    """Left-padded (B, P) ``input_ids`` and ``attention_mask`` of ``prompts``, with the tokenizer's
    special tokens (e.g. a BOS), as :func:`ppo_lm.stages.data.encode_prompt_response` encodes the
    prompts that SFT and the reward model are trained on."""
    enc = tokenizer(prompts, return_tensors="pt", padding=True, padding_side="left")
    return enc["input_ids"], enc["attention_mask"]


def response_texts(tokenizer, gen: Generation) -> list[str]:
    """What a verifier scores: each response's tokens without the stop token that ended it (which may
    be an ordinary token such as "\\n", see ``rollout.stop_tokens``), special tokens skipped."""
    rows = []
    for ids, mask, stopped in zip(gen.responses, gen.mask, gen.terminated):
        kept = ids[mask].tolist()
        rows.append(kept[:-1] if bool(stopped) else kept)
    return tokenizer.batch_decode(rows, skip_special_tokens=True)
