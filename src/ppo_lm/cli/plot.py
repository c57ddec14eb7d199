"""`ppo-lm plot RUN_DIR [--out PNG]`: a run's diagnostics over iterations as one PNG."""

from __future__ import annotations

import os
from pathlib import Path

from ..reporting.plots import PlotError, plot_run, png_path
from ..runtime.errors import ArgumentParser


def check_png_path(out: Path) -> None:
    """``--out`` can be written: its directory exists and is writable, and it is not a directory."""
    if out.is_dir():
        raise PlotError(f"--out {str(out)!r} is a directory; give a file name such as {str(out / 'diagnostics.png')!r}")
    parent = out.parent
    if not parent.is_dir():
        what = "is a file, not a directory;" if parent.exists() else "does not exist; create it or"
        raise PlotError(f"--out {str(out)!r}: {str(parent)!r} {what} choose another --out")
    if not os.access(parent, os.W_OK | os.X_OK) or (out.exists() and not os.access(out, os.W_OK)):
        raise PlotError(f"--out {str(out)!r} is not writable (permission denied); choose another --out")


def plot_command(argv: list[str]) -> Path:
    p = ArgumentParser(prog="ppo-lm plot", description="PNG of a run's diagnostics over iterations.")
    p.add_argument("run_dir", help="an OUTPUT_DIR holding metrics.jsonl")
    p.add_argument("--out", default=None, help="PNG path (default RUN_DIR/diagnostics.png)")
    a = p.parse_args(argv)
    run_dir = Path(a.run_dir)
    metrics = run_dir / "metrics.jsonl"
    if not run_dir.is_dir():
        what = "is a file" if run_dir.exists() else "does not exist"
        raise PlotError(f"run directory {str(run_dir)!r} {what}; give a train run's --output-dir")
    if not metrics.is_file():
        raise PlotError(f"{metrics} not found; give a train run's --output-dir (the directory holding metrics.jsonl)")
    out = Path(a.out) if a.out else run_dir / "diagnostics.png"
    check_png_path(out)
    check_png_path(png_path(out))  # what is written when out has no suffix
    path = plot_run(metrics, out)
    print(path, flush=True)
    return path


def cmd_plot(argv: list[str]) -> int:
    from .main import _run

    return _run(lambda: plot_command(argv))

