"""Atomic checkpoints: write into a temporary directory, then rename; keep the last k.

Layout of ``OUTPUT_DIR/checkpoints/iter_000012``::

    policy/        save_pretrained (safetensors) + tokenizer — loads with AutoModelForCausalLM
    critic/        save_pretrained of the separate critic (AutoModelForTokenClassification); with LoRA
                   its adapters, and a frozen critic's value head alone (trainer/checkpoint/model_files.py)
    value_head.safetensors   the shared-body value head, when the critic is shared
    trainer_state.pt         optimisers, schedulers, KL controller, RNG states, iteration (tensors and
                             plain values only: read with ``torch.load(weights_only=True)``)
    manifest.json            every other file's size and SHA-256, written last

A crash (or Ctrl-C) while writing leaves only a ``.tmp-*`` directory, which is ignored and cleaned
up later, so the previous checkpoint stays the latest valid one. Older checkpoints are pruned only
once the new one is complete, and never the new one itself nor one newer than it. A checkpoint
damaged afterwards (a truncated copy, a full disk during a later rewrite) fails :func:`verify`, and
resume falls back to an older one. tests/test_fault_injection.py kills the trainer at each step.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
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
    kill_point("begin", iteration)
    return tmp, final


def kill_point(name: str, iteration: int) -> None:
    # test hook (tests/test_fault_injection.py): PPO_LM_TEST_KILL_AT=ITERATION:NAME SIGKILLs the process here
    if os.environ.get("PPO_LM_TEST_KILL_AT") == f"{iteration}:{name}":
        os.kill(os.getpid(), signal.SIGKILL)


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


def verify(directory: Path, checksums: bool = True) -> str | None:
    """None when every file the checkpoint's manifest lists is there with its size and checksum;
    else what is wrong, in words. ``checksums=False``: names and sizes only (no file is read), the
    check the start-up runs before any model loads."""
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
        if checksums and _sha256(f) != meta["sha256"]:
            return f"{name} does not match its checksum"
    return None


def _fsync_dir(directory: Path) -> None:
    """Make a rename in ``directory`` durable (best effort: not every platform or file system can)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def commit(tmp: Path, final: Path, keep_last: int) -> None:
    """Publish ``tmp`` as ``final`` atomically, then :func:`prune`. The manifest is written after every
    other file is on disk, so a checkpoint with a valid manifest is complete."""
    iteration = int(_NAME.match(final.name).group(1))
    for f in tmp.rglob("*"):
        if f.is_file():
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())
    kill_point("fsync", iteration)
    write_manifest(tmp)
    kill_point("manifest", iteration)
    if final.exists():  # re-saving an iteration (one resume skipped as damaged): swap, old one aside
        aside = final.with_name(f".tmp-replaced-{final.name}")
        final.rename(aside)
        try:
            tmp.rename(final)
        except BaseException:
            aside.rename(final)
            raise
        shutil.rmtree(aside, ignore_errors=True)
    else:
        tmp.rename(final)
    _fsync_dir(final.parent)
    kill_point("publish", iteration)
    prune(final.parent.parent, iteration, keep_last)


def prune(output_dir: str | Path, newest: int, keep_last: int) -> None:
    """Delete all but the newest ``keep_last`` checkpoints up to iteration ``newest`` (the one just
    written, complete). It is never deleted, nor is any checkpoint newer than it: those are left from
    an attempt that resume fell back from (damaged ones), and are replaced when the run gets there.
    Each goes first to a ``.tmp-*`` name (atomic), so a crash mid-delete leaves no half checkpoint."""
    older = [p for i, p in list_checkpoints(output_dir) if i < newest]
    for p in older[: max(len(older) - (keep_last - 1), 0)]:
        aside = p.with_name(f".tmp-pruned-{p.name}")
        try:
            p.rename(aside)
        except OSError:
            continue  # left for the next save to prune
        kill_point("prune", newest)
        shutil.rmtree(aside, ignore_errors=True)
