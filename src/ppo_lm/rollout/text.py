"""Responses back to text at the end of a rollout: what a verifier scores (prompts go in through
:mod:`ppo_lm.data.prompts`)."""

from __future__ import annotations

from .sampling import Generation


def response_texts(tokenizer, gen: Generation) -> list[str]:
    """What a verifier scores: each response's tokens without the stop token that ended it (which may
    be an ordinary token such as "\\n", see ``rollout.stop_tokens``), special tokens skipped."""
    rows = []
    for ids, mask, stopped in zip(gen.responses, gen.mask, gen.terminated):
        kept = ids[mask].tolist()
        rows.append(kept[:-1] if bool(stopped) else kept)
    return tokenizer.batch_decode(rows, skip_special_tokens=True)
