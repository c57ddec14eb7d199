"""Rows of data and the prompts made of them: reading files, directories and in-memory rows, chat
messages and their rendering by a chat template, and the tokenisation shared by the rollout and the
SFT and reward-model stages.

The names below load their module on first use (PEP 562), so a process that needs only
:mod:`ppo_lm.data.messages` — an environment's worker — does not import torch."""

from importlib import import_module

_EXPORTS = {
    "InputError": "rows",
    "encode_prompt_response": "examples",
    "encode_prompts": "prompts",
    "is_conversation": "messages",
    "last_token_index": "examples",
    "load_preference_rows": "examples",
    "load_rows": "rows",
    "load_sft_rows": "examples",
    "pad_sequences": "examples",
    "render_conversation": "prompts",
    "split_rows": "examples",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(f".{_EXPORTS[name]}", __name__), name)
