"""Where per-iteration diagnostics go: metrics.jsonl, samples.jsonl, TensorBoard, a progress bar."""

from __future__ import annotations

import json
import math
from pathlib import Path

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from .files import atomic_write_text

TIMING_KEYS_SUFFIXES = ("_s", "_per_s")
"""Metrics ending so measure wall time; they are the only ones that differ between identical runs."""


def is_timing_key(key: str) -> bool:
    return key.endswith(TIMING_KEYS_SUFFIXES)


def truncate_jsonl(path: Path, max_iteration: int) -> None:
    """Drop lines logged after ``max_iteration`` (a resumed run re-logs them); the file is replaced
    atomically."""
    if not path.is_file():
        return
    keep = []
    for line in path.read_text().splitlines():
        try:
            if json.loads(line).get("iteration", 0) <= max_iteration:
                keep.append(line)
        except json.JSONDecodeError:
            continue  # a line cut by a crash
    atomic_write_text(path, "".join(k + "\n" for k in keep))  # a crash here must not cut the log


class MetricsLogger:
    """Appends one JSON object per iteration; mirrors to TensorBoard when installed."""

    def __init__(self, output_dir: str | Path, *, tensorboard: bool = True, progress: bool = True, total: int = 0):
        self.dir = Path(output_dir)
        self.metrics_path = self.dir / "metrics.jsonl"
        self.samples_path = self.dir / "samples.jsonl"
        self.tb = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self.tb = SummaryWriter(str(self.dir / "tensorboard"))
            except ImportError:
                self.tb = None
        self.progress = None
        if progress:
            self.progress = Progress(
                TextColumn("[bold]ppo-lm[/]"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                TextColumn("{task.fields[headline]}"),
                # No refresh thread: it competes with torch's OpenMP workers for the 2 cores of a
                # laptop-class CPU (measured: iterations 4-100x slower); redraw once per iteration.
                auto_refresh=False,
            )
            self.task = self.progress.add_task("train", total=total, headline="")

    def start(self, completed: int) -> None:
        if self.progress:
            self.progress.update(self.task, completed=completed)
            self.progress.start()
            self.progress.refresh()

    def log(self, iteration: int, metrics: dict[str, float]) -> None:
        row = {"iteration": iteration}
        row.update({k: (float(v) if math.isfinite(float(v)) else None) for k, v in metrics.items()})
        with open(self.metrics_path, "a") as f:
            f.write(json.dumps(row) + "\n")
            f.flush()
        if self.tb is not None:
            for k, v in metrics.items():
                if math.isfinite(float(v)):
                    self.tb.add_scalar(k, float(v), iteration)
            self.tb.flush()
        if self.progress:
            head = f"score {metrics.get('score', float('nan')):.3f}  ref_kl {metrics.get('ref_kl', float('nan')):.3f}"
            if "value_loss" in metrics:
                head += f"  vf {metrics['value_loss']:.3f}"
            self.progress.update(self.task, completed=iteration, headline=head)
            self.progress.refresh()

    def log_samples(self, iteration: int, rows: list[dict]) -> None:
        with open(self.samples_path, "a") as f:
            for r in rows:
                f.write(json.dumps({"iteration": iteration, **r}) + "\n")

    def close(self) -> None:
        if self.progress:
            self.progress.stop()
        if self.tb is not None:
            self.tb.close()
