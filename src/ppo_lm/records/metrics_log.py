"""Where per-iteration diagnostics go: metrics.jsonl, samples.jsonl, credit.jsonl, the experiment trackers of
`log.report_to` (trackers.py), a progress bar."""

from __future__ import annotations

import dataclasses
import json
import math
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from ..runtime.files import atomic_write_text
from .trackers import Trackers

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


_TENSORBOARD_NOTICE_SHOWN = False


def _tensorboard_missing_notice() -> None:
    global _TENSORBOARD_NOTICE_SHOWN
    if not _TENSORBOARD_NOTICE_SHOWN:
        _TENSORBOARD_NOTICE_SHOWN = True
        print("ppo-lm: note: TensorBoard is not installed, so metrics go to metrics.jsonl only (pip install "
              "tensorboard, or pass --log.no-tensorboard)", file=sys.stderr, flush=True)


def headline(metrics: dict[str, float]) -> str:
    """The few numbers a person watches: score (± its spread), KL to the reference, the losses, the
    held-out score; those an iteration lacks are left out."""
    parts = []
    if "score" in metrics:
        parts.append(f"score {metrics['score']:.3f}" + (f" ±{metrics['score_std']:.3f}" if "score_std" in metrics else ""))
    for key, short in (("reward_per_turn", "reward/turn"), ("turns_mean", "turns"), ("ref_kl", "ref_kl"),
                       ("policy_loss", "pg"), ("value_loss", "vf"), ("eval_score", "eval"), ("eval_pass_at_k", "pass@k")):
        if key in metrics:
            parts.append(f"{short} {metrics[key]:.3f}")
    return "  ".join(parts)


class MetricsLogger:
    """Appends one JSON object per iteration; mirrors it to the experiment trackers of ``report_to``
    (``None`` = TensorBoard only; ``tensorboard=False`` leaves TensorBoard out: the older switch,
    `log.tensorboard`); shows progress — a bar on a terminal, plain flushed lines in a log file
    (``print_every``). ``config``: the run's settings (a dict, or the config dataclass), recorded by
    the trackers that keep hyperparameters; ``run_name`` None = the output directory's name."""

    def __init__(self, output_dir: str | Path, *, report_to: Iterable[str] | None = None, run_name: str | None = None,
                 config: Mapping[str, Any] | Any | None = None, tensorboard: bool = True, progress: bool = True,
                 total: int = 0, print_every: int = 1, terminal: bool | None = None):
        self.dir = Path(output_dir)
        self.metrics_path = self.dir / "metrics.jsonl"
        self.samples_path = self.dir / "samples.jsonl"
        self.credit_path = self.dir / "credit.jsonl"
        self.total = total
        names = ["tensorboard"] if report_to is None else list(report_to)
        if not tensorboard:
            names = [n for n in names if n != "tensorboard"]
        if config is not None and dataclasses.is_dataclass(config) and not isinstance(config, type):
            from ..config.io import to_dict

            config = to_dict(config)
        self.trackers = Trackers(names, run_name, self.dir, config, tensorboard_missing=_tensorboard_missing_notice)
        terminal = sys.stdout.isatty() if terminal is None else terminal
        self.print_every = print_every if progress and not terminal else 0
        self.progress = None
        if progress and terminal:
            self.progress = Progress(
                TextColumn("[bold]ppo-lm[/]"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                TextColumn("{task.fields[headline]}"),
                # No refresh thread: it competes with torch's OpenMP workers for the cores of a
                # laptop-class CPU (docs/benchmarks.md, "Defaults behind measurements"); redraw once
                # per iteration.
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
        self.trackers.log(iteration, metrics)  # NaN/inf left out there
        if self.progress:
            self.progress.update(self.task, completed=iteration, headline=headline(metrics))
            self.progress.refresh()
        if self.print_every and (iteration % self.print_every == 0 or iteration == self.total):
            took = f"  {metrics['iteration_s']:.1f} s" if "iteration_s" in metrics else ""
            print(f"iteration {iteration}/{self.total}  {headline(metrics)}{took}", flush=True)

    def log_samples(self, iteration: int, rows: list[dict]) -> None:
        self._append(self.samples_path, iteration, rows)

    def log_credit(self, iteration: int, rows: list[dict]) -> None:
        """credit.jsonl: one record per sampled episode with its per-token lists (trainer/credit.py)."""
        self._append(self.credit_path, iteration, rows)

    @staticmethod
    def _append(path: Path, iteration: int, rows: list[dict]) -> None:
        with open(path, "a") as f:
            for r in rows:
                f.write(json.dumps({"iteration": iteration, **r}) + "\n")

    def close(self) -> None:
        """Called from a ``finally``: a tracker that records it marks the run failed when an exception
        is on its way."""
        if self.progress:
            self.progress.stop()
        self.trackers.close()
