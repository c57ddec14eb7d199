"""Prompts from rows to token ids: which cells are chat messages, their rendering by the chat
template, the checks of a prompt dataset, and the left-padded encoding the rollout, evaluation and
the demo share with the SFT and reward-model stages (:mod:`ppo_lm.data.examples`)."""

from __future__ import annotations

from pathlib import Path

from torch import Tensor

from ..runtime.errors import ConfigError
from .messages import is_conversation


def render_conversation(tokenizer, messages: list[dict], template: str | None = None) -> str:
    """The prompt text of ``messages`` by the tokenizer's chat template (or ``template``, Jinja source),
    ending with the assistant turn's opening (``add_generation_prompt``) so the policy writes the
    reply."""
    return tokenizer.apply_chat_template(messages, chat_template=template, tokenize=False,
                                         add_generation_prompt=True)


def encode_prompts(tokenizer, prompts: list[str], add_special_tokens: bool = True) -> tuple[Tensor, Tensor]:
    """Left-padded (B, P) ``input_ids`` and ``attention_mask`` of ``prompts``, with the tokenizer's
    special tokens (e.g. a BOS), as :func:`ppo_lm.data.examples.encode_prompt_response` encodes the
    prompts that SFT and the reward model are trained on. ``add_special_tokens=False`` for prompts
    rendered by a chat template, which writes its own (a second BOS would be off-distribution)."""
    enc = tokenizer(prompts, return_tensors="pt", padding=True, padding_side="left",
                    add_special_tokens=add_special_tokens)
    return enc["input_ids"], enc["attention_mask"]


def check_prompt_rows(rows: list[dict], prompt_column: str | None, source: str = "`data.prompts`") -> None:
    """Every row has the same columns (the verifier receives them for every response) and a non-empty
    text in ``prompt_column`` (None: rows for an environment's reset, whose columns are its own)."""
    if not rows:
        raise ConfigError(f"{source}: the prompt dataset is empty")
    not_dict = next((i for i, r in enumerate(rows) if not isinstance(r, dict)), None)
    if not_dict is not None:
        raise ConfigError(f"{source}: row {not_dict} is a {type(rows[not_dict]).__name__}, not a dict of columns")
    odd = next((i for i, r in enumerate(rows) if r.keys() != rows[0].keys()), None)
    if odd is not None:
        raise ConfigError(
            f"{source}: row {odd} has columns {sorted(rows[odd])} but row 0 has {sorted(rows[0])}; every "
            "row needs the same columns (the verifier receives them for every response)"
        )
    if prompt_column is None:
        return
    if prompt_column not in rows[0]:
        raise ConfigError(f"{source}: no column {prompt_column!r} (`data.prompt_column`); columns: {sorted(rows[0])}")
    bad = [i for i, r in enumerate(rows) if not (isinstance(r[prompt_column], str) and r[prompt_column])
           and not is_conversation(r[prompt_column])]
    if bad:
        raise ConfigError(f"{source}: row {bad[0]} has an empty or non-text `{prompt_column}` (give text, or a "
                          "list of {'role': ..., 'content': ...} messages)")
    chat = is_conversation(rows[0][prompt_column])
    odd = next((i for i, r in enumerate(rows) if is_conversation(r[prompt_column]) != chat), None)
    if odd is not None:
        raise ConfigError(f"{source}: rows 0 and {odd} hold different kinds of `{prompt_column}` (plain text and "
                          "chat messages); use one kind")


def render_prompts(rows: list[dict], column: str, chat_template: str, tokenizer) -> tuple[list[dict], bool]:
    """Rows whose ``column`` (``data.prompt_column``) holds chat messages, rendered to text with the
    chat template (``data.chat_template``: auto, none or a Jinja file); returns (rows, rendered).
    Plain-text prompts are returned as they are."""
    if not rows or not is_conversation(rows[0][column]):
        return rows, False
    if chat_template == "none":
        raise ConfigError(f"`data.prompts`: `{column}` holds chat messages but `data.chat_template` is 'none'; "
                          "set it to 'auto' (the tokenizer's template) or a Jinja file")
    template = None
    if chat_template != "auto":
        template = Path(chat_template).read_text()
    elif not getattr(tokenizer, "chat_template", None):
        raise ConfigError(f"`data.prompts`: `{column}` holds chat messages but the tokenizer has no chat template; "
                          "set `data.chat_template` to a Jinja template file")
    try:
        return [{**r, column: render_conversation(tokenizer, r[column], template)} for r in rows], True
    except Exception as e:  # noqa: BLE001 (a user's Jinja template can raise anything)
        raise ConfigError(f"`data.chat_template`: rendering the messages of row 0 failed: {type(e).__name__}: {e}") from None


def check_prompt_lengths(rows: list[dict], prompt_column: str, tokenizer, *, max_prompt_tokens: int,
                         add_special_tokens: bool = True) -> int:
    """Every prompt fits ``max_prompt_tokens`` (the context less the response length), counted as the
    rollout encodes it. Returns the longest prompt's length in tokens."""
    lengths = [len(ids) for ids in tokenizer([r[prompt_column] for r in rows],
                                             add_special_tokens=add_special_tokens)["input_ids"]]
    longest = max(range(len(rows)), key=lengths.__getitem__)
    if lengths[longest] > max_prompt_tokens:
        raise ConfigError(
            f"`data.prompts`: prompt {longest} has {lengths[longest]} tokens but the model's context leaves "
            f"{max_prompt_tokens} for the prompt (max_position_embeddings − rollout.max_new_tokens); "
            f"shorten it or lower `rollout.max_new_tokens`: {rows[longest][prompt_column][:80]!r}"
        )
    return lengths[longest]
