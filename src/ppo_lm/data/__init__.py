"""Rows of data and the prompts made of them: reading files, directories and in-memory rows, chat
messages and their rendering by a chat template, and the tokenisation shared by the rollout and the
SFT and reward-model stages."""

from .examples import (
    encode_prompt_response,
    last_token_index,
    load_preference_rows,
    load_sft_rows,
    pad_sequences,
    split_rows,
)
from .prompts import encode_prompts, is_conversation, render_conversation
from .rows import InputError, load_rows

__all__ = [
    "InputError",
    "encode_prompt_response",
    "encode_prompts",
    "is_conversation",
    "last_token_index",
    "load_preference_rows",
    "load_rows",
    "load_sft_rows",
    "pad_sequences",
    "render_conversation",
    "split_rows",
]
