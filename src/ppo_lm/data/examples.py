"""Chat data and tokenisation of the SFT and reward-model stages.

Chat data (TRL's conversational formats) is turned into prompt/response text rows by
:func:`load_sft_rows` and :func:`load_preference_rows`, which read their input with
:mod:`ppo_lm.data.rows` (files, directories, in-memory rows); :func:`encode_prompt_response`
renders a prompt of messages with the tokenizer's chat template.
"""

from __future__ import annotations

import contextlib
import json
import random
from collections.abc import Iterator, Mapping, Sequence

from .rows import InputError, RowsLike, check_rows, read_source


class ChatTemplateError(InputError):
    """The chat template is missing, or failed on a row's messages."""


# ----------------------------------------------------------------------------------------------
# Chat data of the SFT and reward-model stages (TRL's conversational formats)
# ----------------------------------------------------------------------------------------------

_MESSAGES = "a list of {'role': ..., 'content': ...} messages"


def _describe(value: object) -> str:
    text = repr(value)
    return f"a {type(value).__name__} ({text[:60]}{'…' if len(text) > 60 else ''})"


def assistant_text(value: object, what: str = "the response") -> str:
    """A response cell as text: a string as it is, or the content of a list holding one assistant
    message (TRL's conversational ``completion``/``chosen``/``rejected``)."""
    if isinstance(value, str):
        return value
    if (isinstance(value, list) and len(value) == 1 and isinstance(value[0], Mapping)
            and value[0].get("role") == "assistant" and isinstance(value[0].get("content"), str)):
        return value[0]["content"]
    raise InputError(f"{what} holds {_describe(value)}, not text or a list of one "
                     "{'role': 'assistant', 'content': ...} message")


def split_conversation(messages: object, what: str = "the conversation") -> tuple[list[dict], str]:
    """``(prompt messages, response text)`` of a conversation that ends with an assistant turn: the
    prompt is every message before that turn, the response its content."""
    from .messages import is_conversation

    if not is_conversation(messages):
        raise InputError(f"{what} holds {_describe(messages)}, not {_MESSAGES}")
    last = messages[-1]["role"]
    if last != "assistant":
        raise InputError(f"{what} ends with a {last!r} message; it must end with the assistant turn to train on")
    if len(messages) < 2:
        raise InputError(f"{what} holds only an assistant message; it needs the prompt's messages before it")
    return list(messages[:-1]), messages[-1]["content"]


def load_sft_rows(path_or_rows: RowsLike, name: str = "sft data", split: str = "train") -> list[dict]:
    """Rows with a ``prompt`` (text or chat messages) and a ``response`` (text), as
    :func:`~ppo_lm.data.rows.load_rows` reads them. Also accepted, as in TRL: a ``response`` that is
    a list of one assistant message, and a ``messages`` column (a conversation ending with an
    assistant turn) in place of ``prompt`` and ``response``, split into the messages before that turn
    (the prompt) and its content (the response). Rows keep their other columns."""
    rows, source = read_source(path_or_rows, name, split)
    out = []
    for i, row in enumerate(rows):
        if isinstance(row, Mapping):
            what = f"{name}: row {i} of {source}: column"
            if "prompt" in row and "response" in row:
                row = {**row, "response": assistant_text(row["response"], f"{what} 'response'")}
            elif "messages" in row:
                prompt, response = split_conversation(row["messages"], f"{what} 'messages'")
                row = {**row, "prompt": prompt, "response": response}
        out.append(row)
    check_rows(out, ("prompt", "response"), name, source, text_only=("response",),
                hint=" (or a 'messages' column: a conversation ending with an assistant turn)")
    return out


def load_preference_rows(path_or_rows: RowsLike, name: str = "preference data", split: str = "train") -> list[dict]:
    """Rows with a ``prompt`` (text or chat messages) and ``chosen``/``rejected`` (text), as
    :func:`~ppo_lm.data.rows.load_rows` reads them. Also accepted, as in TRL: ``chosen``/``rejected``
    that are lists of one assistant message, and, without a ``prompt`` column, ``chosen``/``rejected``
    conversations that share every message before their last (assistant) turn: that shared part is
    the prompt."""
    from .messages import is_conversation

    rows, source = read_source(path_or_rows, name, split)
    out = []
    for i, row in enumerate(rows):
        if isinstance(row, Mapping) and "chosen" in row and "rejected" in row:
            what = f"{name}: row {i} of {source}: column"
            if "prompt" in row:
                row = {**row, "chosen": assistant_text(row["chosen"], f"{what} 'chosen'"),
                       "rejected": assistant_text(row["rejected"], f"{what} 'rejected'")}
            elif is_conversation(row["chosen"]) and is_conversation(row["rejected"]):
                prompt, chosen = split_conversation(row["chosen"], f"{what} 'chosen'")
                prompt_r, rejected = split_conversation(row["rejected"], f"{what} 'rejected'")
                if prompt != prompt_r:
                    raise InputError(f"{name}: row {i} of {source}: the 'chosen' and 'rejected' conversations differ "
                                     "before their last assistant turn, so neither is the prompt; give a 'prompt' column")
                row = {**row, "prompt": prompt, "chosen": chosen, "rejected": rejected}
        out.append(row)
    check_rows(out, ("prompt", "chosen", "rejected"), name, source, text_only=("chosen", "rejected"))
    return out


def check_chat_template(tokenizer, rows: Sequence[Mapping], name: str, column: str = "prompt") -> None:
    """Refuse rows whose ``column`` holds chat messages when ``tokenizer`` has no chat template."""
    from .messages import is_conversation

    if not getattr(tokenizer, "chat_template", None) and any(is_conversation(r.get(column)) for r in rows):
        raise ChatTemplateError(
            f"{name}: the '{column}' column holds chat messages but the tokenizer has no chat template; use a "
            "tokenizer with a chat template (chat_template in its tokenizer_config.json, or chat_template.jinja)")


@contextlib.contextmanager
def naming(name: str) -> Iterator[None]:
    """Prefix ``name`` (which data) to a :class:`ChatTemplateError` raised inside."""
    try:
        yield
    except ChatTemplateError as e:
        raise ChatTemplateError(f"{name}: {e}") from None


def split_rows(rows: Sequence[dict], heldout_fraction: float, seed: int,
               group_by: str | None = "prompt") -> tuple[list[dict], list[dict]]:
    """Shuffle deterministically and cut off about ``heldout_fraction`` of the rows (at least one
    when > 0), whole groups at a time: rows that share ``group_by`` (the prompt, text or chat messages;
    None: every row is its own group) all land on the same side, so held-out prompts are never trained
    on (datasets such as the built-in demonstrations repeat prompts). Groups are taken while they fit
    the target, so the held-out share does not overshoot by a big group; with a single prompt, rows
    are split alone.

    Returns ``(train, heldout)``; ``heldout`` is empty when ``heldout_fraction`` is 0. At least one
    training row is always kept.
    """
    if not 0.0 <= heldout_fraction < 1.0:
        raise InputError(f"heldout_fraction must be in [0, 1), got {heldout_fraction}")
    groups: dict[object, list[int]] = {}
    for i, row in enumerate(rows):
        key = row.get(group_by, i) if group_by is not None else i
        if isinstance(key, (list, dict)):  # chat messages: grouped by their JSON text
            key = "\0" + json.dumps(key, sort_keys=True, default=str)
        groups.setdefault(key, []).append(i)
    order = list(groups.values())
    if len(order) == 1 and len(rows) > 1:  # one prompt only: hold out rows of it rather than nothing
        order = [[i] for i in range(len(rows))]
    random.Random(seed).shuffle(order)
    held_idx: list[int] = []
    if heldout_fraction > 0 and len(order) > 1:
        target = max(1, round(heldout_fraction * len(rows)))
        for members in order[:-1]:  # the last group always trains
            if len(held_idx) + len(members) <= target:  # whole groups that fit, so no overshoot
                held_idx += members
        if not held_idx:  # every group is bigger than the target: the smallest one (others keep training)
            held_idx = min(order, key=len)
    held_set = set(held_idx)
    return [rows[i] for i in range(len(rows)) if i not in held_set], [rows[i] for i in sorted(held_set)]


# ----------------------------------------------------------------------------------------------
# Tokenisation shared by the SFT and reward-model stages
# ----------------------------------------------------------------------------------------------


def prompt_ids(tokenizer, prompt: str | list[dict], add_special_tokens: bool = True) -> list[int]:
    """Token ids of a prompt as the PPO rollout encodes it: text with the tokenizer's special tokens
    (e.g. a BOS; unless ``add_special_tokens`` is False), or chat messages rendered by the chat
    template (:func:`ppo_lm.rollout.score.reward.render_conversation`, assistant turn opened) and encoded
    without adding special tokens, since the template writes its own (a second BOS would be
    off-distribution). Raises :class:`ChatTemplateError` when the tokenizer has no chat template or
    the template fails on the messages."""
    from .messages import is_conversation
    from .prompts import render_conversation

    if not is_conversation(prompt):
        return list(tokenizer(prompt, add_special_tokens=add_special_tokens)["input_ids"])
    if not getattr(tokenizer, "chat_template", None):
        raise ChatTemplateError("a prompt of chat messages needs a tokenizer with a chat template, and this one has "
                                "none; use a tokenizer with a chat template")
    try:
        text = render_conversation(tokenizer, prompt)
    except Exception as e:  # noqa: BLE001 (a Jinja template can raise anything)
        raise ChatTemplateError(f"the chat template failed on the messages {_describe(prompt)}: "
                                f"{type(e).__name__}: {e}") from None
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def encode_prompt_response(
    tokenizer, prompt: str | list[dict], response: str | list[dict], add_special_tokens: bool = True
) -> tuple[list[int], list[int]]:
    """Token ids of ``prompt`` and of ``response`` + EOS, tokenised separately.

    Separately because that is how PPO sees them: the rollout tokenises the prompt alone and samples
    response tokens after it, so the SFT policy and the reward model must be trained on the same
    boundary (joint tokenisation can merge characters across it with BPE tokenizers). Special tokens
    (e.g. a BOS) are added to a text prompt only, as a plain ``tokenizer(prompts)`` call in the rollout
    would do; a prompt of chat messages is rendered by the chat template and gets none added (see
    :func:`prompt_ids`). ``response`` is text or a list of one assistant message. The response ends
    with the tokenizer's EOS id (for chat models their end-of-turn token, e.g. ``<|im_end|>``); one
    that already ends with the EOS text does not get a second EOS.
    """
    eos_id = tokenizer.eos_token_id
    if eos_id is None:
        raise InputError("the tokenizer has no eos_token; set one so responses can end")
    response = assistant_text(response)
    if tokenizer.eos_token and response.endswith(tokenizer.eos_token):
        response = response[: -len(tokenizer.eos_token)]
    p_ids = prompt_ids(tokenizer, prompt, add_special_tokens)
    response_ids = list(tokenizer(response, add_special_tokens=False)["input_ids"]) + [eos_id]
    return p_ids, response_ids


def pad_sequences(seqs: Sequence[Sequence[int]], pad_id: int, side: str = "right", fill=None):
    """Stack ragged id lists into ``(input_ids, attention_mask)``, both ``(B, T_max)`` int64.

    ``fill`` (default ``pad_id``) is the value put in padded slots, e.g. -100 for labels.
    """
    import torch

    if side not in ("left", "right"):
        raise ValueError(f"side must be 'left' or 'right', got {side!r}")
    fill = pad_id if fill is None else fill
    t_max = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), t_max), fill, dtype=torch.long)
    mask = torch.zeros((len(seqs), t_max), dtype=torch.long)
    for i, s in enumerate(seqs):
        if not s:
            continue
        sl = slice(0, len(s)) if side == "right" else slice(t_max - len(s), t_max)
        ids[i, sl] = torch.as_tensor(list(s), dtype=torch.long)
        mask[i, sl] = 1
    return ids, mask


def last_token_index(attention_mask):
    """``(B,)`` index of the last attended token of each row, for left or right padding.

    Computed from the mask rather than from ``input_ids != pad_token_id`` (what HF's sequence
    classifiers do), which breaks when the pad token doubles as EOS.
    """
    mask = attention_mask.long()
    t = mask.shape[-1]
    if bool((mask.sum(-1) == 0).any()):
        raise ValueError("a row of attention_mask has no attended token")
    return (t - 1) - mask.flip(-1).argmax(-1)
