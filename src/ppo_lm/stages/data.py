"""Loading row datasets (SFT demonstrations, preference pairs, PPO prompts) from the usual places.

Every stage takes "rows": a list of dicts, one per example. :func:`load_rows` turns whatever the user
pointed a config at into that, and fails early with a message naming the path and the columns, since
a typo in a column name otherwise surfaces as a ``KeyError`` deep inside a training loop.

Which reader reads what:

- ``.jsonl`` (and a ``.json`` file holding JSON Lines): read line by line with :mod:`json`, so every
  row is exactly the object on its line (no schema inference: columns may differ between rows and hold
  mixed types, chat messages keep exactly their keys) and a bad line is reported as ``FILE:LINE``.
- ``.json`` holding one document: a JSON array of objects (one row each) or an object of columns
  (every value a list of one length), read with :mod:`json` for the same reasons. ``datasets`` 5.x
  reads an object of columns as a single row and turns a string cell such as ``"1"`` into the number
  1 when a column mixes types, so it is not used for JSON.
- ``.csv``, ``.parquet``, ``.arrow`` (Arrow IPC stream or file, e.g. a ``save_to_disk`` shard or a
  ``datasets`` cache file): ``datasets.load_dataset(<builder>, data_files=...)``.
- a directory written by ``save_to_disk`` (a ``Dataset``, or a ``DatasetDict`` whose ``split`` is
  taken): ``datasets.load_from_disk``.
- any other directory: its data files and their splits as ``datasets`` resolves them
  (``load_dataset_builder``: ``train.jsonl``/``test.jsonl``, ``data/train-00000-of-00001.parquet``,
  a dataset repository's README ``configs``; files that match no split name are all ``train``), each
  file then read as above.

``datasets`` is kept quiet (no progress bars, its logger silenced, both restored afterwards)
and its cache goes to a temporary directory that is removed once the rows are read: nothing is written
next to the user's data or under ``~/.cache/huggingface``. The price is that a CSV/Parquet/Arrow input
is copied once into that temporary directory (``$TMPDIR``) while it is read. Rows from Arrow-backed
formats have the keys that Arrow added to chat messages as ``None`` (a struct has every key of every
message) removed again, so a message is the dict that was written.

Chat data (TRL's conversational formats) is turned into prompt/response text rows by
:func:`load_sft_rows` and :func:`load_preference_rows`; :func:`encode_prompt_response` renders a
prompt of messages with the tokenizer's chat template.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import random
import tempfile
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..errors import UserError
from ..models.logprobs import position_ids_from_mask  # noqa: F401 (re-exported)

RowsLike = str | os.PathLike | Sequence[Mapping[str, Any]]

# file extension -> the datasets builder that reads it ("json" files are read with the json module)
DATA_EXTENSIONS = {".jsonl": "json", ".json": "json", ".csv": "csv", ".parquet": "parquet", ".arrow": "arrow"}
_EXTENSIONS_TEXT = ", ".join(DATA_EXTENSIONS)


class InputError(UserError, ValueError):
    """Bad input from the user to a stage — a data file, a column, a setting; the message says which
    and how to fix it (the commands print it without a traceback)."""


class ChatTemplateError(InputError):
    """The chat template is missing, or failed on a row's messages."""


# ----------------------------------------------------------------------------------------------
# Readers
# ----------------------------------------------------------------------------------------------


def _read_jsonl(path: Path, name: str) -> list[dict]:
    rows = []
    with path.open("r", encoding="utf-8-sig") as f:  # a BOM (as some Windows tools write) is no data
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise InputError(f"{name}: {path}:{lineno}: not valid JSON ({e.msg})") from e
            if not isinstance(row, dict):
                raise InputError(
                    f"{name}: {path}:{lineno}: expected a JSON object per line, got {type(row).__name__}"
                )
            rows.append(row)
    return rows


def _is_columns(doc: dict) -> bool:
    """An object of columns: every value a list, all of one length, none of them a conversation (an
    object such as ``{"messages": [...]}`` is one row, not a column of message dicts)."""
    from ..rollout.text import is_conversation

    values = list(doc.values())
    return (bool(values) and all(isinstance(v, list) for v in values) and len({len(v) for v in values}) == 1
            and not any(is_conversation(v) for v in values))


def _read_json(path: Path, name: str) -> list[dict]:
    """A ``.json`` file: JSON Lines (as today), a JSON array of objects, or an object of columns."""
    text = path.read_text(encoding="utf-8-sig")
    if not text.strip():
        return []
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        first = next(line for line in text.splitlines() if line.strip())
        try:
            first_ok = isinstance(json.loads(first), dict)
        except json.JSONDecodeError:
            first_ok = False
        if e.msg == "Extra data" or first_ok:  # more than one document: JSON Lines
            return _read_jsonl(path, name)
        raise InputError(f"{name}: {path}:{e.lineno}:{e.colno}: not valid JSON ({e.msg})") from e
    if isinstance(doc, list):
        bad = next((i for i, r in enumerate(doc) if not isinstance(r, dict)), None)
        if bad is not None:
            raise InputError(f"{name}: {path}: expected a JSON array of objects (one per row), but item {bad} is a "
                             f"{type(doc[bad]).__name__}")
        return doc
    if isinstance(doc, dict):
        if _is_columns(doc):
            names = list(doc)
            return [dict(zip(names, cells)) for cells in zip(*doc.values())]
        return [doc]
    raise InputError(f"{name}: {path}: expected JSON Lines, a JSON array of objects or an object of columns, got a "
                     f"{type(doc).__name__}")


@contextlib.contextmanager
def _quiet_datasets() -> Iterator[Any]:
    """``datasets`` without progress bars and with its logger silenced (its errors come back as our
    one-line :class:`InputError`), both restored on exit."""
    import datasets
    from datasets.utils import logging as ds_logging

    bars = datasets.is_progress_bar_enabled()
    verbosity = ds_logging.get_verbosity()
    datasets.disable_progress_bars()
    ds_logging.set_verbosity(ds_logging.CRITICAL)
    try:
        yield datasets
    finally:
        ds_logging.set_verbosity(verbosity)
        if bars:
            datasets.enable_progress_bars()


def _reason(e: BaseException) -> str:
    """The first line of the innermost cause of ``e`` (datasets wraps the reader's own error)."""
    while e.__cause__ is not None or (e.__context__ is not None and not e.__suppress_context__):
        e = e.__cause__ or e.__context__
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0]}" if text else type(e).__name__


def _drop_null_message_keys(rows: list[dict]) -> list[dict]:
    """Arrow stores a list of messages as a list of structs holding every key any message has; the keys
    a message did not have come back as None. Remove them, so a message is the dict that was written
    (chat templates test ``'tool_calls' in message``)."""
    def clean(value):
        if isinstance(value, list) and value and all(isinstance(m, dict) and "role" in m for m in value):
            return [{k: v for k, v in m.items() if v is not None} for m in value]
        return value

    return [{k: clean(v) for k, v in row.items()} for row in rows]


def _to_rows(ds) -> list[dict]:
    return _drop_null_message_keys(ds.to_list())


def _load_with_datasets(builder: str, files: list[Path], name: str, source: str) -> list[dict]:
    if all(f.stat().st_size == 0 for f in files):
        return []
    with _quiet_datasets() as datasets, tempfile.TemporaryDirectory(prefix="ppo_lm_data_") as cache:
        try:
            ds = datasets.load_dataset(builder, data_files=[str(f) for f in files], split="train", cache_dir=cache)
        except Exception as e:  # noqa: BLE001 (whatever the reader raises on a damaged file)
            if "corresponds to no data" in str(e):  # a file with a header or schema but no rows
                return []
            raise InputError(f"{name}: cannot read {source} as {builder}: {_reason(e)}") from None
        rows = _to_rows(ds)
        del ds  # unmap the cache files before the directory goes
    return rows


def _read_files(files: list[Path], name: str, source: str) -> list[dict]:
    """Rows of data files, in order: JSON with the json module, the rest through datasets (consecutive
    files of one format in one call)."""
    rows: list[dict] = []
    for builder, group in itertools.groupby(files, key=lambda f: DATA_EXTENSIONS.get(f.suffix.lower())):
        group = list(group)
        if builder is None:
            raise InputError(f"{name}: cannot read {group[0]}: unknown extension {group[0].suffix!r} (expected "
                             f"{_EXTENSIONS_TEXT}, or a directory of such files or written by datasets' save_to_disk)")
        if builder == "json":
            for f in group:
                rows += _read_jsonl(f, name) if f.suffix.lower() == ".jsonl" else _read_json(f, name)
        else:
            rows += _load_with_datasets(builder, group, name, source if len(files) == 1 else str(group[0].parent))
    return rows


def _split_of(splits: Mapping[str, Any], split: str, name: str, source: str):
    if split not in splits:
        raise InputError(f"{name}: {source} has no split {split!r}; its splits: {sorted(splits)}")
    return splits[split]


def _read_directory(path: Path, name: str, split: str) -> tuple[list[dict], str]:
    source = str(path)
    if (path / "dataset_dict.json").is_file() or (path / "state.json").is_file():  # save_to_disk
        with _quiet_datasets() as datasets:
            try:
                ds = datasets.load_from_disk(source)
            except Exception as e:  # noqa: BLE001
                raise InputError(f"{name}: cannot read {source} (written by datasets' save_to_disk): "
                                 f"{_reason(e)}") from None
            if isinstance(ds, datasets.DatasetDict):
                ds = _split_of(ds, split, name, source)
                source = f"{source} (split {split!r})"
            return _to_rows(ds), source
    data_files = [f for f in path.rglob("*") if f.suffix.lower() in DATA_EXTENSIONS and f.is_file()
                  and not any(part.startswith(".") for part in f.relative_to(path).parts)]
    if not data_files:
        raise InputError(f"{name}: {source} is a directory with no data files ({_EXTENSIONS_TEXT}) and not one "
                         "written by datasets' save_to_disk (no state.json or dataset_dict.json)")
    with _quiet_datasets() as datasets, tempfile.TemporaryDirectory(prefix="ppo_lm_data_") as cache:
        try:
            builder = datasets.load_dataset_builder(source, cache_dir=cache)
        except Exception as e:  # noqa: BLE001 (e.g. a README declaring several configs)
            raise InputError(f"{name}: cannot read the directory {source}: {_reason(e)}") from None
        splits = {str(k): [Path(f) for f in v] for k, v in (builder.config.data_files or {}).items()}
    files = _split_of(splits, split, name, source)
    if len(splits) > 1 or split != "train":
        source = f"{source} (split {split!r})"
    return _read_files(sorted(files), name, source), source


def _read(path_or_rows: RowsLike, name: str, split: str) -> tuple[list, str]:
    """The rows of ``path_or_rows`` unchecked, and what to call their source in messages."""
    if not isinstance(path_or_rows, (str, os.PathLike)):
        return [dict(r) if isinstance(r, Mapping) else r for r in path_or_rows], "in-memory rows"
    path = Path(path_or_rows).expanduser()
    source = str(path)
    if not path.exists():
        raise InputError(f"{name}: no such file or directory: {source}")
    if path.is_dir():
        return _read_directory(path, name, split)
    if path.suffix.lower() not in DATA_EXTENSIONS:
        raise InputError(
            f"{name}: cannot read {source}: unknown extension {path.suffix!r} (expected {_EXTENSIONS_TEXT}, "
            "a directory of such files, or a directory written by datasets' save_to_disk)"
        )
    return _read_files([path], name, source), source


def _check_rows(rows: list, required: Sequence[str], name: str, source: str, text_only: Sequence[str] = (),
                hint: str = "") -> None:
    """Every row a dict holding the ``required`` columns, each text or chat messages (text only for the
    columns in ``text_only``); ``hint`` is added to a missing-column message."""
    from ..rollout.text import is_conversation

    if not rows:
        raise InputError(f"{name}: {source} is empty")
    for i, row in enumerate(rows):
        if not isinstance(row, Mapping):
            raise InputError(f"{name}: row {i} of {source} is a {type(row).__name__}, not a dict")
        missing = [c for c in required if c not in row]
        if missing:
            raise InputError(
                f"{name}: row {i} of {source} lacks column(s) {missing}; columns found: {sorted(row.keys())}{hint}"
            )
        for c in required:
            value = row[c]
            if isinstance(value, str) or (c not in text_only and is_conversation(value)):
                continue
            what = "text" if c in text_only else "text (or a list of {'role': ..., 'content': ...} chat messages)"
            raise InputError(f"{name}: row {i} of {source} has a {type(value).__name__} in column {c!r}, not {what}")


def load_rows(
    path_or_rows: RowsLike,
    required_columns: Iterable[str] = (),
    name: str = "dataset",
    split: str = "train",
) -> list[dict]:
    """Rows as a list of dicts from a list, a local file (``.jsonl``, ``.json``: JSON Lines, an array
    of objects or an object of columns; ``.csv``, ``.parquet``, ``.arrow``) or a directory (written
    by ``datasets``' ``save_to_disk``, or holding such files); see the module's docstring.

    ``split`` picks the split where the data has several (a saved ``DatasetDict``, a directory of
    per-split files such as ``train.jsonl``/``test.jsonl``); a single file or saved ``Dataset`` has
    none and is read whole. Raises :class:`InputError` for a missing path, an unknown extension, an
    unreadable file (a bad JSON line as ``FILE:LINE``), a missing split (listing the splits), an empty
    dataset, or a row that lacks one of ``required_columns`` (the message lists the columns that were
    found) or holds something other than text or chat messages in one of them. ``name`` says which
    dataset it is in error messages (e.g. ``"sft data"``).
    """
    rows, source = _read(path_or_rows, name, split)
    _check_rows(rows, list(required_columns), name, source)
    return rows


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
    from ..rollout.text import is_conversation

    if not is_conversation(messages):
        raise InputError(f"{what} holds {_describe(messages)}, not {_MESSAGES}")
    last = messages[-1]["role"]
    if last != "assistant":
        raise InputError(f"{what} ends with a {last!r} message; it must end with the assistant turn to train on")
    if len(messages) < 2:
        raise InputError(f"{what} holds only an assistant message; it needs the prompt's messages before it")
    return list(messages[:-1]), messages[-1]["content"]


def load_sft_rows(path_or_rows: RowsLike, name: str = "sft data", split: str = "train") -> list[dict]:
    """Rows with a ``prompt`` (text or chat messages) and a ``response`` (text), as :func:`load_rows`
    reads them. Also accepted, as in TRL: a ``response`` that is a list of one assistant message, and a
    ``messages`` column (a conversation ending with an assistant turn) in place of ``prompt`` and
    ``response``, split into the messages before that turn (the prompt) and its content (the
    response). Rows keep their other columns."""
    rows, source = _read(path_or_rows, name, split)
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
    _check_rows(out, ("prompt", "response"), name, source, text_only=("response",),
                hint=" (or a 'messages' column: a conversation ending with an assistant turn)")
    return out


def load_preference_rows(path_or_rows: RowsLike, name: str = "preference data", split: str = "train") -> list[dict]:
    """Rows with a ``prompt`` (text or chat messages) and ``chosen``/``rejected`` (text), as
    :func:`load_rows` reads them. Also accepted, as in TRL: ``chosen``/``rejected`` that are lists of
    one assistant message, and, without a ``prompt`` column, ``chosen``/``rejected`` conversations that
    share every message before their last (assistant) turn: that shared part is the prompt."""
    from ..rollout.text import is_conversation

    rows, source = _read(path_or_rows, name, split)
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
    _check_rows(out, ("prompt", "chosen", "rejected"), name, source, text_only=("chosen", "rejected"))
    return out


def check_chat_template(tokenizer, rows: Sequence[Mapping], name: str, column: str = "prompt") -> None:
    """Refuse rows whose ``column`` holds chat messages when ``tokenizer`` has no chat template."""
    from ..rollout.text import is_conversation

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


# ----------------------------------------------------------------------------------------------
# Tokenisation shared by the SFT and reward-model stages
# ----------------------------------------------------------------------------------------------


def prompt_ids(tokenizer, prompt: str | list[dict], add_special_tokens: bool = True) -> list[int]:
    """Token ids of a prompt as the PPO rollout encodes it: text with the tokenizer's special tokens
    (e.g. a BOS; unless ``add_special_tokens`` is False), or chat messages rendered by the chat
    template (:func:`ppo_lm.rollout.text.render_conversation`, assistant turn opened) and encoded
    without adding special tokens, since the template writes its own (a second BOS would be
    off-distribution). Raises :class:`ChatTemplateError` when the tokenizer has no chat template or
    the template fails on the messages."""
    from ..rollout.text import is_conversation, render_conversation

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
