"""Responses back to text at the end of a rollout: what a verifier scores (prompts go in through
:mod:`ppo_lm.data.prompts`)."""

from __future__ import annotations

from .sampling import Generation


def kept_ids(gen: Generation) -> list[list[int]]:
    """Each response's token ids without the stop token that ended it (which may be an ordinary token
    such as "\\n", see ``rollout.stop_tokens``): what its text is decoded from."""
    rows = []
    for ids, mask, stopped in zip(gen.responses, gen.mask, gen.terminated):
        kept = ids[mask].tolist()
        rows.append(kept[:-1] if bool(stopped) else kept)
    return rows


def response_texts(tokenizer, gen: Generation) -> list[str]:
    """What a verifier scores: each response's :func:`kept_ids`, special tokens skipped."""
    return tokenizer.batch_decode(kept_ids(gen), skip_special_tokens=True)
