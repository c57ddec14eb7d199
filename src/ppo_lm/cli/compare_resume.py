"""Continuing a comparison (`ppo-lm compare --resume`): the runs of the plan that already finished with
the settings the plan gives them are kept, not run again, and every other run starts from the
beginning. A comparison of several estimators and seeds on a pretrained model runs for hours; this
picks up one that was stopped, and extends one with more seeds or estimators (docs/compare.md).

A run counts as finished once its record is written (``runs/E-seedS.record.json``, after its process
ended well and its numbers were read); the settings it ran with are the ``runs/E-seedS.yaml`` it was
started with. Each record names the CPU it ran on, since a per-second column only compares runs of one
host (docs/benchmarks.md "Hosts").
"""

from __future__ import annotations

import json
import shutil
from functools import cache
from pathlib import Path

from ..config.train import TrainConfig

KEEP = ("sft", "heldout.jsonl", "runs", "logs")
"""What a resumed comparison keeps of the earlier one's outputs (summary.json, summary.md and
curves.png are written anew)."""


def record_path(out: Path, name: str) -> Path:
    return out / "runs" / f"{name}.record.json"


def save_record(out: Path, name: str, record: dict) -> None:
    """``record`` (one run's numbers, curves included) as the mark that the run finished."""
    from ..runtime.files import atomic_write_text

    atomic_write_text(record_path(out, name), json.dumps(record))


def setting_changes(run: TrainConfig, saved: Path) -> list[str]:
    """``name: X then, Y now`` for each setting of ``run`` that differs from the YAML a run was started
    with (every setting counts: a run of 40 iterations is not one of 60)."""
    from ..config.io import flatten, load_saved_config, to_dict

    now, then = flatten(to_dict(run)), flatten(load_saved_config(saved, TrainConfig))
    return [f"{k}: {then.get(k, '(unset)')!r} then, {now.get(k, '(unset)')!r} now"
            for k in sorted(set(now) | set(then)) if now.get(k) != then.get(k)]


def finished(out: Path, name: str, run: TrainConfig) -> tuple[dict | None, str]:
    """The record of run ``name`` where it finished with ``run``'s settings, else None and why it runs
    (again)."""
    path = record_path(out, name)
    if not path.is_file():
        return None, "not finished before" if (out / "runs" / name).exists() else "new"
    changes = setting_changes(run, out / "runs" / f"{name}.yaml")
    if changes:
        return None, f"settings changed since it ran ({'; '.join(changes[:3])}{' …' if len(changes) > 3 else ''})"
    try:
        return json.loads(path.read_text()), "kept"
    except (OSError, ValueError):
        return None, "its record is unreadable"


def clear_run(out: Path, name: str) -> None:
    """A run that will run again starts from an empty directory (its checkpoints are not resumed: an
    interrupted run's wall time would not be one process's)."""
    for p in (out / "runs" / name, record_path(out, name)):
        if p.is_dir():
            shutil.rmtree(p)
        elif p.exists():
            p.unlink()


def start_built(out: Path, build_policy: bool) -> bool:
    """Whether the built-in task's start (held-out file and, where it is built, the SFT policy, saved
    at the end of its training) is already in ``out``."""
    return (out / "heldout.jsonl").is_file() and (not build_policy or (out / "sft" / "model.safetensors").is_file())


@cache
def cpu_model() -> str:
    """The CPU's model name as the kernel reports it (``/proc/cpuinfo``), with its family and model
    numbers, which tell apart hosts that share a name; "unknown" where it cannot be read."""
    fields: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            fields.setdefault(key.strip(), value.strip())
    except OSError:
        return "unknown"
    name = fields.get("model name", "unknown")
    if "cpu family" in fields and "model" in fields:
        name += f" (family {fields['cpu family']}, model {fields['model']})"
    return name
