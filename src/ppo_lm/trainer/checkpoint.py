"""Atomic checkpoints: write into a temporary directory, then rename; keep the last k.

Layout of ``OUTPUT_DIR/checkpoints/iter_000012``::

    policy/        save_pretrained (safetensors) + tokenizer — loads with AutoModelForCausalLM
    critic/        save_pretrained of the separate critic (AutoModelForTokenClassification)
    value_head.safetensors   the shared-body value head, when the critic is shared
    trainer_state.pt         optimisers, schedulers, KL controller, RNG states, iteration

A crash (or Ctrl-C) while writing leaves only a ``.tmp-*`` directory, which is ignored and cleaned
up later, so the previous checkpoint stays the latest valid one.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

_NAME = re.compile(r"^iter_(\d+)$")


def checkpoint_dir(output_dir: str | Path) -> Path:
    return Path(output_dir) / "checkpoints"


def list_checkpoints(output_dir: str | Path) -> list[tuple[int, Path]]:
    root = checkpoint_dir(output_dir)
    if not root.is_dir():
        return []
    found = []
    for p in root.iterdir():
        m = _NAME.match(p.name)
        if m and p.is_dir() and (p / "trainer_state.pt").is_file():
            found.append((int(m.group(1)), p))
    return sorted(found)


def latest_checkpoint(output_dir: str | Path) -> tuple[int, Path] | None:
    found = list_checkpoints(output_dir)
    return found[-1] if found else None


def begin(output_dir: str | Path, iteration: int) -> tuple[Path, Path]:
    """Return (temporary dir to write into, final dir)."""
    root = checkpoint_dir(output_dir)
    root.mkdir(parents=True, exist_ok=True)
    for stale in root.glob(".tmp-*"):
        shutil.rmtree(stale, ignore_errors=True)
    final = root / f"iter_{iteration:06d}"
    tmp = root / f".tmp-iter_{iteration:06d}"
    tmp.mkdir()
    return tmp, final


def commit(tmp: Path, final: Path, keep_last: int) -> None:
    """Publish ``tmp`` as ``final`` atomically, then drop all but the newest ``keep_last``."""
    for f in tmp.rglob("*"):
        if f.is_file():
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())
    if final.exists():  # re-saving the same iteration (e.g. final save right after a periodic one)
        old = final.with_name(final.name + ".old")
        final.rename(old)
        tmp.rename(final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        tmp.rename(final)
    for _, p in list_checkpoints(final.parent.parent)[:-keep_last]:
        shutil.rmtree(p, ignore_errors=True)
