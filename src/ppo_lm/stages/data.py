"""Loading row datasets (SFT demonstrations, preference pairs, PPO prompts) from the usual places.

Every stage takes "rows": a list of dicts, one per example. :func:`load_rows` turns whatever the user
pointed a config at into that, and fails early with a message naming the path and the columns, since
a typo in a column name otherwise surfaces as a ``KeyError`` deep inside a training loop.
"""

from __future__ import annotations

import json
import os
import random
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..errors import UserError
from ..models.logprobs import position_ids_from_mask  # noqa: F401 (re-exported)

RowsLike = str | os.PathLike | Sequence[Mapping[str, Any]]


class InputError(UserError, ValueError):
    """Bad input from the user to a stage — a data file, a column, a setting; the message says which
    and how to fix it (the commands print it without a traceback)."""


def _read_jsonl(path: Path) -> list[dict]:
    rows = []
    with path.open("r", encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise InputError(f"{path}:{lineno}: not valid JSON ({e.msg})") from e
            if not isinstance(row, dict):
                raise InputError(
                    f"{path}:{lineno}: expected a JSON object per line, got {type(row).__name__}"
                )
            rows.append(row)
    return rows


def _read_parquet(path: Path) -> list[dict]:
    import pyarrow.parquet as pq

    return pq.read_table(path).to_pylist()


def _read_saved_dataset(path: Path) -> list[dict]:
    import datasets

    ds = datasets.load_from_disk(str(path))
    if isinstance(ds, datasets.DatasetDict):
        if "train" not in ds:
            raise InputError(
                f"{path}: a DatasetDict without a 'train' split (splits: {sorted(ds.keys())}); "
                "save the split you want with Dataset.save_to_disk"
            )
        ds = ds["train"]
    return ds.to_list()


def load_rows(
    path_or_rows: RowsLike,
    required_columns: Iterable[str] = (),
    name: str = "dataset",
) -> list[dict]:
    """Rows as a list of dicts from a list, a ``.jsonl``/``.json`` lines file, a ``.parquet`` file or
    a directory written by ``datasets.Dataset.save_to_disk``.

    Raises :class:`InputError` for a missing path, an unknown extension, an empty dataset, or a row that
    lacks one of ``required_columns`` (the message lists the columns that were found) or holds
    something other than text in one of them. ``name`` says
    which dataset it is in error messages (e.g. ``"sft data"``).
    """
    required = list(required_columns)
    if isinstance(path_or_rows, (str, os.PathLike)):
        path = Path(path_or_rows).expanduser()
        source = str(path)
        if not path.exists():
            raise InputError(f"{name}: no such file or directory: {source}")
        if path.is_dir():
            if not (path / "dataset_info.json").exists() and not (path / "dataset_dict.json").exists():
                raise InputError(
                    f"{name}: {source} is a directory but not one written by datasets' save_to_disk "
                    "(no dataset_info.json or dataset_dict.json)"
                )
            rows = _read_saved_dataset(path)
        elif path.suffix in (".jsonl", ".json"):
            rows = _read_jsonl(path)
        elif path.suffix == ".parquet":
            rows = _read_parquet(path)
        else:
            raise InputError(
                f"{name}: cannot read {source}: unknown extension {path.suffix!r} "
                "(expected .jsonl, .parquet, or a datasets save_to_disk directory)"
            )
    else:
        source = "in-memory rows"
        rows = [dict(r) for r in path_or_rows]

    if not rows:
        raise InputError(f"{name}: {source} is empty")
    for i, row in enumerate(rows):
        if not isinstance(row, Mapping):
            raise InputError(f"{name}: row {i} of {source} is a {type(row).__name__}, not a dict")
        missing = [c for c in required if c not in row]
        if missing:
            raise InputError(
                f"{name}: row {i} of {source} lacks column(s) {missing}; columns found: {sorted(row.keys())}"
            )
        not_text = [c for c in required if not isinstance(row[c], str)]
        if not_text:
            c = not_text[0]
            raise InputError(f"{name}: row {i} of {source} has a {type(row[c]).__name__} in column {c!r}, not text")
    return rows


def split_rows(rows: Sequence[dict], heldout_fraction: float, seed: int,
               group_by: str | None = "prompt") -> tuple[list[dict], list[dict]]:
    """Shuffle deterministically and cut off about ``heldout_fraction`` of the rows (at least one
    when > 0), whole groups at a time: rows that share ``group_by`` (the prompt; None: every row is
    its own group) all land on the same side, so held-out prompts are never trained on (datasets
    such as the built-in demonstrations repeat prompts). Groups are taken while they fit the target, so
    the held-out share does not overshoot by a big group; with a single prompt, rows are split alone.

    Returns ``(train, heldout)``; ``heldout`` is empty when ``heldout_fraction`` is 0. At least one
    training row is always kept.
    """
    if not 0.0 <= heldout_fraction < 1.0:
        raise InputError(f"heldout_fraction must be in [0, 1), got {heldout_fraction}")
    groups: dict[object, list[int]] = {}
    for i, row in enumerate(rows):
        groups.setdefault(row.get(group_by, i) if group_by is not None else i, []).append(i)
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


def encode_prompt_response(
    tokenizer, prompt: str, response: str, add_special_tokens: bool = True
) -> tuple[list[int], list[int]]:
    """Token ids of ``prompt`` and of ``response`` + EOS, tokenised separately.

    Separately because that is how PPO sees them: the rollout tokenises the prompt alone and samples
    response tokens after it, so the SFT policy and the reward model must be trained on the same
    boundary (joint tokenisation can merge characters across it with BPE tokenizers). Special tokens
    (e.g. a BOS) are added to the prompt only, as a plain ``tokenizer(prompts)`` call in the rollout
    would do. A response that already ends with the EOS text does not get a second EOS.
    """
    eos_id = tokenizer.eos_token_id
    if eos_id is None:
        raise InputError("the tokenizer has no eos_token; set one so responses can end")
    if tokenizer.eos_token and response.endswith(tokenizer.eos_token):
        response = response[: -len(tokenizer.eos_token)]
    prompt_ids = list(tokenizer(prompt, add_special_tokens=add_special_tokens)["input_ids"])
    response_ids = list(tokenizer(response, add_special_tokens=False)["input_ids"]) + [eos_id]
    return prompt_ids, response_ids


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
