"""Between text and tokens at the edges of a rollout: prompts in, responses out — one way for the
rollout, evaluation and the demo, and the same prompt encoding as the SFT and reward-model stages."""

from __future__ import annotations

from torch import Tensor

from .sampling import Generation


def encode_prompts(tokenizer, prompts: list[str], add_special_tokens: bool = True) -> tuple[Tensor, Tensor]:
    """Left-padded (B, P) ``input_ids`` and ``attention_mask`` of ``prompts``, with the tokenizer's
    special tokens (e.g. a BOS), as :func:`ppo_lm.stages.data.encode_prompt_response` encodes the
    prompts that SFT and the reward model are trained on. ``add_special_tokens=False`` for prompts
    rendered by a chat template, which writes its own (a second BOS would be off-distribution)."""
    enc = tokenizer(prompts, return_tensors="pt", padding=True, padding_side="left",
                    add_special_tokens=add_special_tokens)
    return enc["input_ids"], enc["attention_mask"]


def is_conversation(value: object) -> bool:
    """A prompt given as chat messages: a non-empty list of ``{"role": str, "content": str}``."""
    return (isinstance(value, list) and bool(value)
            and all(isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
                    for m in value))


def render_conversation(tokenizer, messages: list[dict], template: str | None = None) -> str:
    """The prompt text of ``messages`` by the tokenizer's chat template (or ``template``, Jinja source),
    ending with the assistant turn's opening (``add_generation_prompt``) so the policy writes the
    reply."""
    return tokenizer.apply_chat_template(messages, chat_template=template, tokenize=False,
                                         add_generation_prompt=True)


def response_texts(tokenizer, gen: Generation) -> list[str]:
    """What a verifier scores: each response's tokens without the stop token that ended it (which may
    be an ordinary token such as "\\n", see ``rollout.stop_tokens``), special tokens skipped."""
    rows = []
    for ids, mask, stopped in zip(gen.responses, gen.mask, gen.terminated):
        kept = ids[mask].tolist()
        rows.append(kept[:-1] if bool(stopped) else kept)
    return tokenizer.batch_decode(rows, skip_special_tokens=True)
