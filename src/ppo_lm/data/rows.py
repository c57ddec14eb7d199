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
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import tempfile
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..runtime.errors import UserError

RowsLike = str | os.PathLike | Sequence[Mapping[str, Any]]

# file extension -> the datasets builder that reads it ("json" files are read with the json module)
DATA_EXTENSIONS = {".jsonl": "json", ".json": "json", ".csv": "csv", ".parquet": "parquet", ".arrow": "arrow"}
_EXTENSIONS_TEXT = ", ".join(DATA_EXTENSIONS)


class InputError(UserError, ValueError):
    """Bad input from the user to a stage — a data file, a column, a setting; the message says which
    and how to fix it (the commands print it without a traceback)."""


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
    from .messages import is_conversation

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


def read_source(path_or_rows: RowsLike, name: str, split: str) -> tuple[list, str]:
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


def check_rows(rows: list, required: Sequence[str], name: str, source: str, text_only: Sequence[str] = (),
               hint: str = "") -> None:
    """Every row a dict holding the ``required`` columns, each text or chat messages (text only for the
    columns in ``text_only``); ``hint`` is added to a missing-column message."""
    from .messages import is_conversation

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
    rows, source = read_source(path_or_rows, name, split)
    check_rows(rows, list(required_columns), name, source)
    return rows

