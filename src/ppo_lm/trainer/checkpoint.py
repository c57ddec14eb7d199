"""Atomic checkpoints: write into a temporary directory, then rename; keep the last k.

Layout of ``OUTPUT_DIR/checkpoints/iter_000012``::

    policy/        save_pretrained (safetensors) + tokenizer — loads with AutoModelForCausalLM
    critic/        save_pretrained of the separate critic (AutoModelForTokenClassification)
    value_head.safetensors   the shared-body value head, when the critic is shared
    trainer_state.pt         optimisers, schedulers, KL controller, RNG states, iteration (tensors and
                             plain values only: read with ``torch.load(weights_only=True)``)
    manifest.json            every other file's size and SHA-256, written last

A crash (or Ctrl-C) while writing leaves only a ``.tmp-*`` directory, which is ignored and cleaned
up later, so the previous checkpoint stays the latest valid one. A checkpoint damaged afterwards (a
truncated copy, a full disk during a later rewrite) fails :func:`verify`, and resume falls back to an
older one.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from pathlib import Path

_NAME = re.compile(r"^iter_(\d+)$")
MANIFEST = "manifest.json"


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


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def write_manifest(directory: Path) -> None:
    """Record the size and SHA-256 of every file under ``directory`` in its manifest (and fsync it)."""
    files = {str(f.relative_to(directory)): {"size": f.stat().st_size, "sha256": _sha256(f)}
             for f in sorted(directory.rglob("*")) if f.is_file() and f.name != MANIFEST}
    path = directory / MANIFEST
    with open(path, "w") as fh:
        json.dump({"files": files}, fh, indent=1)
        fh.flush()
        os.fsync(fh.fileno())


def verify(directory: Path) -> str | None:
    """None when every file the checkpoint's manifest lists is there with its size and checksum;
    else what is wrong, in words."""
    try:
        listed = json.loads((directory / MANIFEST).read_text())["files"]
    except FileNotFoundError:
        return "it has no manifest.json (an interrupted write, or a checkpoint of an older ppo-lm)"
    except (OSError, ValueError, KeyError, TypeError) as e:
        return f"its manifest.json is unreadable ({e})"
    for name, meta in listed.items():
        f = directory / name
        if not f.is_file():
            return f"{name} is missing"
        if f.stat().st_size != meta["size"]:
            return f"{name} has {f.stat().st_size} bytes, the manifest says {meta['size']}"
        if _sha256(f) != meta["sha256"]:
            return f"{name} does not match its checksum"
    return None


def commit(tmp: Path, final: Path, keep_last: int) -> None:
    """Publish ``tmp`` as ``final`` atomically, then drop all but the newest ``keep_last``. The
    manifest is written after every other file is on disk, so a checkpoint with a valid manifest is
    complete."""
    for f in tmp.rglob("*"):
        if f.is_file():
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())
    write_manifest(tmp)
    if final.exists():  # re-saving the same iteration (e.g. final save right after a periodic one)
        old = final.with_name(final.name + ".old")
        final.rename(old)
        tmp.rename(final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        tmp.rename(final)
    for _, p in list_checkpoints(final.parent.parent)[:-keep_last]:
        shutil.rmtree(p, ignore_errors=True)
