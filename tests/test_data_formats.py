"""`load_rows` on every local format `datasets` reads — JSON Lines, JSON (array, object of columns),
CSV, Parquet, Arrow, `save_to_disk` directories and plain directories of per-split files — with
splits, chat messages that come back as the dicts that were written, quiet `datasets` that writes no
cache next to the data or under ~/.cache, and one-line errors."""

from __future__ import annotations

import json
import logging
import os
import tempfile
from pathlib import Path

import datasets
import pyarrow as pa
import pytest

from ppo_lm.data.rows import InputError, load_rows

ROWS = [{"prompt": "Solve x+1=3\n", "response": "x=2"}, {"prompt": "Solve 2x=8\n", "response": "x=4"}]
CHAT = [
    {"prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Solve x+1=3"}], "answer": "2"},
    {"prompt": [{"role": "user", "content": "Solve 2x=8", "name": "bob"}], "answer": "4"},
]


def _jsonl(path: Path, rows) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _files(path: Path) -> set[str]:
    return {str(p.relative_to(path)) for p in path.rglob("*")}


@pytest.fixture
def private_tmp(tmp_path, monkeypatch):
    """tempfile's directory, to see that what datasets caches there is gone after each call."""
    tmp = tmp_path / "_tmp"
    tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    return tmp


# -- formats -----------------------------------------------------------------------------------


def test_jsonl_rows_are_exactly_the_lines(tmp_path):
    """JSON Lines is read line by line: rows keep their own columns and types, messages their keys."""
    rows = [*CHAT, {"prompt": "text", "answer": 3, "extra": None}]
    assert load_rows(_jsonl(tmp_path / "c.jsonl", rows), [], name="data") == rows
    assert load_rows(_jsonl(tmp_path / "c.json", rows), [], name="data") == rows  # JSON Lines in a .json
    (tmp_path / "bom.jsonl").write_bytes(b"\xef\xbb\xbf" + (tmp_path / "c.jsonl").read_bytes())  # a Windows BOM
    assert load_rows(tmp_path / "bom.jsonl") == rows


def test_json_array_and_object_of_columns(tmp_path):
    (tmp_path / "array.json").write_text(json.dumps(CHAT, indent=2))
    assert load_rows(tmp_path / "array.json", ["prompt"]) == CHAT
    (tmp_path / "compact.json").write_text(json.dumps(ROWS))
    assert load_rows(tmp_path / "compact.json", ["prompt", "response"]) == ROWS
    columns = {"prompt": [r["prompt"] for r in ROWS], "response": [r["response"] for r in ROWS]}
    (tmp_path / "columns.json").write_text(json.dumps(columns, indent=2))
    assert load_rows(tmp_path / "columns.json", ["prompt", "response"]) == ROWS
    (tmp_path / "columns1.json").write_text(json.dumps(columns))
    assert load_rows(tmp_path / "columns1.json", ["prompt", "response"]) == ROWS
    # one object whose list is a conversation is one row, not a column of message dicts
    one = {"messages": CHAT[0]["prompt"]}
    (tmp_path / "one.json").write_text(json.dumps(one, indent=2))
    assert load_rows(tmp_path / "one.json") == [one]


def test_csv(tmp_path):
    (tmp_path / "rows.csv").write_text('prompt,response,n\n"Solve x+1=3, then stop",x=2,1\nhi,there,2\n')
    assert load_rows(tmp_path / "rows.csv", ["prompt", "response"]) == [
        {"prompt": "Solve x+1=3, then stop", "response": "x=2", "n": 1},
        {"prompt": "hi", "response": "there", "n": 2},
    ]


def test_parquet_keeps_chat_messages_as_the_dicts_written(tmp_path):
    """A list of messages is a list of Arrow structs holding every key of every message; the keys a
    message did not have (None) are dropped again, so each message is the dict that was written."""
    datasets.Dataset.from_list(CHAT).to_parquet(str(tmp_path / "chat.parquet"))
    rows = load_rows(tmp_path / "chat.parquet", ["prompt"])
    assert rows == CHAT
    assert all(isinstance(m, dict) for r in rows for m in r["prompt"])


def test_arrow_files(tmp_path):
    """Arrow IPC stream files (save_to_disk shards, datasets' cache files) and IPC files."""
    datasets.Dataset.from_list(CHAT).save_to_disk(str(tmp_path / "saved"))
    shard = next((tmp_path / "saved").glob("*.arrow"))
    assert load_rows(shard, ["prompt"]) == CHAT
    table = pa.Table.from_pylist(ROWS)
    with pa.OSFile(str(tmp_path / "file.arrow"), "wb") as sink, pa.ipc.new_file(sink, table.schema) as w:
        w.write_table(table)
    assert load_rows(tmp_path / "file.arrow", ["prompt", "response"]) == ROWS


def test_save_to_disk_dataset_and_dataset_dict_splits(tmp_path):
    train, test = datasets.Dataset.from_list(ROWS), datasets.Dataset.from_list(CHAT)
    train.save_to_disk(str(tmp_path / "ds"))
    assert load_rows(tmp_path / "ds", ["prompt"]) == ROWS
    assert load_rows(tmp_path / "ds", ["prompt"], split="test") == ROWS  # one Dataset has no splits: read whole
    datasets.DatasetDict({"train": train, "test": test}).save_to_disk(str(tmp_path / "dd"))
    assert load_rows(tmp_path / "dd", ["prompt"]) == ROWS
    assert load_rows(tmp_path / "dd", ["prompt"], split="test") == CHAT
    with pytest.raises(InputError, match=r"^data: .*dd has no split 'validation'; its splits: \['test', 'train'\]$"):
        load_rows(tmp_path / "dd", ["prompt"], name="data", split="validation")


def test_directory_of_per_split_files(tmp_path):
    d = tmp_path / "jsonl"
    d.mkdir()
    _jsonl(d / "train.jsonl", ROWS)
    _jsonl(d / "test.jsonl", CHAT)
    assert load_rows(d, ["prompt"]) == ROWS
    assert load_rows(d, ["prompt"], split="test") == CHAT
    with pytest.raises(InputError, match=r"jsonl has no split 'dev'; its splits: \['test', 'train'\]"):
        load_rows(d, ["prompt"], split="dev")
    # the Hub's data/<split>-00000-of-00001.parquet layout, shards of one split in order
    hub = tmp_path / "hub"
    (hub / "data").mkdir(parents=True)
    datasets.Dataset.from_list(ROWS[:1]).to_parquet(str(hub / "data" / "train-00000-of-00002.parquet"))
    datasets.Dataset.from_list(ROWS[1:]).to_parquet(str(hub / "data" / "train-00001-of-00002.parquet"))
    datasets.Dataset.from_list(CHAT).to_parquet(str(hub / "data" / "test-00000-of-00001.parquet"))
    assert load_rows(hub, ["prompt"]) == ROWS
    assert load_rows(hub, ["prompt"], split="test") == CHAT
    # files named after no split are all 'train'
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "a.csv").write_text("prompt,response\nhi,there\n")
    (plain / "b.csv").write_text("prompt,response\nbye,now\n")
    assert load_rows(plain, ["prompt"]) == [{"prompt": "hi", "response": "there"}, {"prompt": "bye", "response": "now"}]
    with pytest.raises(InputError, match=r"has no split 'test'; its splits: \['train'\]"):
        load_rows(plain, ["prompt"], split="test")


def test_a_datasets_cache_directory(tmp_path):
    """What load_dataset leaves in its cache (dataset_info.json and <builder>-<split>.arrow, no
    state.json) reads as a directory of per-split Arrow files."""
    data = tmp_path / "data"
    data.mkdir()
    files = {"train": str(_jsonl(data / "t.jsonl", ROWS)), "test": str(_jsonl(data / "e.jsonl", ROWS[:1]))}
    with tempfile.TemporaryDirectory(dir=tmp_path) as cache:
        datasets.load_dataset("json", data_files=files, cache_dir=cache)
        folder = next(Path(cache).rglob("json-train.arrow")).parent
        assert load_rows(folder, ["prompt"]) == ROWS
        assert load_rows(folder, ["prompt"], split="test") == ROWS[:1]


def test_messages_reach_the_trainers_prompt_rows_from_parquet(tmp_path):
    from ppo_lm.config.train import DataConfig
    from ppo_lm.trainer.inputs import read_prompt_rows

    datasets.Dataset.from_list(CHAT).to_parquet(str(tmp_path / "chat.parquet"))
    rows = read_prompt_rows(DataConfig(prompts=str(tmp_path / "chat.parquet")), seed=0)
    assert rows == CHAT


# -- quiet, and no cache left behind -------------------------------------------------------------


def test_datasets_is_quiet_and_leaves_no_cache(tmp_path, private_tmp, capfd):
    d = tmp_path / "data"
    (d / "sub").mkdir(parents=True)
    datasets.Dataset.from_list(ROWS).to_parquet(str(d / "train.parquet"))
    datasets.Dataset.from_list([{"prompt": "hi"}]).to_parquet(str(d / "sub" / "test.parquet"))
    hub_cache = Path(datasets.config.HF_DATASETS_CACHE)
    before_hub = _files(hub_cache) if hub_cache.exists() else None
    before = _files(d)
    ds_logger = logging.getLogger("datasets")
    level, bars = ds_logger.level, datasets.is_progress_bar_enabled()
    capfd.readouterr()
    assert load_rows(d / "train.parquet", ["prompt"]) == ROWS
    assert load_rows(d, ["prompt"]) == ROWS
    assert load_rows(d, ["prompt"], split="test") == [{"prompt": "hi"}]
    with pytest.raises(InputError):
        (d / "bad.parquet").write_bytes(b"not parquet")
        load_rows(d / "bad.parquet")
    out, err = capfd.readouterr()
    assert out == "" and err == ""  # no progress bars, no log lines
    assert _files(d) == before | {"bad.parquet"}  # nothing written next to the data
    assert list(private_tmp.iterdir()) == []  # the temporary cache is removed
    assert (_files(hub_cache) if hub_cache.exists() else None) == before_hub  # nothing under ~/.cache
    assert ds_logger.level == level and datasets.is_progress_bar_enabled() == bars  # settings restored


# -- errors --------------------------------------------------------------------------------------


def _error(source, required=(), **kw) -> str:
    with pytest.raises(InputError) as e:
        load_rows(source, required, name="data", **kw)
    message = str(e.value)
    assert "\n" not in message and message.startswith("data: ")
    return message


def test_missing_path_and_unknown_extension(tmp_path):
    assert _error(tmp_path / "nope.jsonl") == f"data: no such file or directory: {tmp_path / 'nope.jsonl'}"
    (tmp_path / "rows.txt").write_text("hi\n")
    assert f"cannot read {tmp_path / 'rows.txt'}: unknown extension '.txt' (expected .jsonl, .json, .csv, " \
           ".parquet, .arrow" in _error(tmp_path / "rows.txt")


def test_directories_without_data(tmp_path):
    (tmp_path / "empty").mkdir()
    assert _error(tmp_path / "empty") == (
        f"data: {tmp_path / 'empty'} is a directory with no data files (.jsonl, .json, .csv, .parquet, .arrow) and "
        "not one written by datasets' save_to_disk (no state.json or dataset_dict.json)")
    (tmp_path / "text").mkdir()
    (tmp_path / "text" / "notes.txt").write_text("hi\n")
    assert "is a directory with no data files" in _error(tmp_path / "text")


@pytest.mark.parametrize("name,content", [
    ("e.jsonl", "\n\n"), ("e.json", "[]"), ("e.json", " \n"), ("e.csv", "prompt,response\n"), ("e.csv", ""),
])
def test_empty_data(tmp_path, name, content):
    (tmp_path / name).write_text(content)
    assert _error(tmp_path / name) == f"data: {tmp_path / name} is empty"


def test_empty_split(tmp_path):
    _jsonl(tmp_path / "train.jsonl", ROWS)
    (tmp_path / "test.jsonl").write_text("")
    assert _error(tmp_path, split="test") == f"data: {tmp_path} (split 'test') is empty"


def test_missing_column_lists_the_columns(tmp_path):
    datasets.Dataset.from_list(ROWS).to_parquet(str(tmp_path / "r.parquet"))
    assert _error(tmp_path / "r.parquet", ["prompt", "chosen"]) == (
        f"data: row 0 of {tmp_path / 'r.parquet'} lacks column(s) ['chosen']; columns found: ['prompt', 'response']")


def test_bad_json(tmp_path):
    (tmp_path / "bad.jsonl").write_text('{"prompt": "a"}\n\n{"prompt": "b",}\n')
    assert _error(tmp_path / "bad.jsonl") == (
        f"data: {tmp_path / 'bad.jsonl'}:3: not valid JSON (Expecting property name enclosed in double quotes)")
    (tmp_path / "bad2.json").write_text('{"prompt": "a"}\n[1]\n')  # JSON Lines in .json
    assert _error(tmp_path / "bad2.json") == (
        f"data: {tmp_path / 'bad2.json'}:2: expected a JSON object per line, got list")
    (tmp_path / "bad.json").write_text('[\n  {"prompt": "a"},\n  {"prompt": "b"\n]\n')  # a broken document
    assert _error(tmp_path / "bad.json") == (
        f"data: {tmp_path / 'bad.json'}:4:1: not valid JSON (Expecting ',' delimiter)")
    (tmp_path / "strings.json").write_text('["a", "b"]')
    assert _error(tmp_path / "strings.json") == (
        f"data: {tmp_path / 'strings.json'}: expected a JSON array of objects (one per row), but item 0 is a str")
    (tmp_path / "number.json").write_text("3")
    assert "expected JSON Lines, a JSON array of objects or an object of columns, got a int" in \
        _error(tmp_path / "number.json")


def test_damaged_files_are_one_line(tmp_path):
    (tmp_path / "bad.parquet").write_bytes(b"not parquet at all")
    assert _error(tmp_path / "bad.parquet").startswith(
        f"data: cannot read {tmp_path / 'bad.parquet'} as parquet: ArrowInvalid: Parquet magic bytes not found")
    (tmp_path / "bad.arrow").write_bytes(b"not arrow")
    assert _error(tmp_path / "bad.arrow").startswith(f"data: cannot read {tmp_path / 'bad.arrow'} as arrow: ")
    (tmp_path / "bad.csv").write_text('prompt,response\n"unterminated\n')
    assert _error(tmp_path / "bad.csv").startswith(f"data: cannot read {tmp_path / 'bad.csv'} as csv: ParserError: ")


def test_non_text_cells_are_named_but_messages_are_text(tmp_path):
    assert load_rows(CHAT, ["prompt"]) == CHAT
    assert _error([{"prompt": {"role": "user"}}], ["prompt"]) == (
        "data: row 0 of in-memory rows has a dict in column 'prompt', not text (or a list of "
        "{'role': ..., 'content': ...} chat messages)")


def test_paths_as_str_and_user_home(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    _jsonl(tmp_path / "r.jsonl", ROWS)
    assert load_rows("~/r.jsonl", ["prompt"]) == ROWS
    assert load_rows(os.fspath(tmp_path / "r.jsonl"), ["prompt"]) == ROWS


def test_unreadable_directories(tmp_path):
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "state.json").write_text("{not json")
    assert _error(broken).startswith(f"data: cannot read {broken} (written by datasets' save_to_disk): ")
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    _jsonl(mixed / "train.jsonl", ROWS)
    (mixed / "test.csv").write_text("prompt\nhi\n")
    assert _error(mixed).startswith(f"data: cannot read the directory {mixed}: ValueError: Couldn't infer the same "
                                    "data file format for all splits")
