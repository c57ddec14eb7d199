"""The per-token credit report of a run (docs/report.md), drawn from its files.

Reads RUN_DIR/credit.jsonl (written by the trainer every `log.sample_every` iterations, trainer/credit.py)
and RUN_DIR/metrics.jsonl; writes RUN_DIR/report/: index.html (self-contained, :mod:`.report_page`),
credit.png (a heatmap of Â over the tokens of one iteration's episodes) and the diagnostics plots of
:mod:`.plots`.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from ..runtime.errors import UserError
from ..trainer.credit import CREDIT_FILE, PER_TOKEN_KEYS
from .plots import PlotError, plot_proxy_vs_gold, plot_run, read_metrics
from .report_page import render_page


class ReportError(UserError):
    """No run, no credit file, or no such iteration in it; the message says which and the fix."""


def read_credit(run_dir: str | Path) -> dict[int, list[dict]]:
    """The records of RUN_DIR/credit.jsonl by iteration (in file order); a line that is not a record
    (cut by a crash) is skipped."""
    run = Path(run_dir)
    if not run.is_dir():
        what = "is a file" if run.exists() else "does not exist"
        raise ReportError(f"run directory {str(run)!r} {what}; pass a train run's output directory")
    path = run / CREDIT_FILE
    if not path.is_file():
        raise ReportError(f"{str(run)!r} holds no {CREDIT_FILE}: the trainer writes it every `log.sample_every` "
                          "iterations (train with --log.sample-every N > 0, or pass another run directory)")
    by_iteration: dict[int, list[dict]] = {}
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(rec, dict) and isinstance(rec.get("iteration"), int) and isinstance(rec.get("tokens"), list):
            by_iteration.setdefault(rec["iteration"], []).append(rec)
    if not by_iteration:
        raise ReportError(f"{path} holds no episode record yet: the trainer writes the first one at iteration "
                          "`log.sample_every`; report once the run has passed it")
    return by_iteration


def _cell(x) -> float:
    return float(x) if isinstance(x, (int, float)) and math.isfinite(x) else math.nan


def plot_credit(records: list[dict], out_png: Path, title: str = "", key: str = "advantage") -> Path:
    """Heatmap of ``key`` (default Â) over token positions (x) and episodes (y); padding is blank.
    Diverging colours centred at 0, as on the page."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    width = max(len(r["tokens"]) for r in records)
    grid = np.full((len(records), max(width, 1)), np.nan)
    for i, r in enumerate(records):
        vals = r.get(key) or []
        grid[i, : len(vals)] = [_cell(v) for v in vals]
    finite = grid[np.isfinite(grid)]
    vmax = float(np.abs(finite).max()) if finite.size else 0.0
    vmax = vmax or 1.0
    fig, ax = plt.subplots(figsize=(min(3 + 0.3 * width, 16), min(1.5 + 0.35 * len(records), 12)))
    im = ax.imshow(np.ma.masked_invalid(grid), cmap="RdBu_r", vmin=-vmax, vmax=vmax, aspect="auto",
                   interpolation="nearest")
    ax.set_xlabel("response token")
    ax.set_ylabel("episode (score)")
    ax.set_yticks(range(len(records)))
    ax.set_yticklabels([f"{r.get('episode', i)} ({_cell(r.get('score')):.3g})" for i, r in enumerate(records)],
                       fontsize=7)
    fig.colorbar(im, ax=ax, label={"advantage": "Â"}.get(key, key))
    ax.set_title(title or f"{key} per token", fontsize=10)
    fig.tight_layout()
    try:
        fig.savefig(out_png, dpi=110)
    except OSError as e:
        raise ReportError(f"cannot write {out_png}: {e.strerror or e}") from None
    finally:
        plt.close(fig)
    return out_png


def build_report(run_dir: str | Path, iteration: int | None = None) -> Path:
    """Write RUN_DIR/report/{index.html, credit.png, diagnostics.png} for ``iteration`` (default: the last
    one with sampled episodes); returns the page's path."""
    run = Path(run_dir)
    by_iteration = read_credit(run)
    iterations = sorted(by_iteration)
    if iteration is None:
        iteration = iterations[-1]
    elif iteration not in by_iteration:
        shown = ", ".join(map(str, iterations[:8])) + (f", …, {iterations[-1]}" if len(iterations) > 8 else "")
        raise ReportError(f"--iteration {iteration}: {run / CREDIT_FILE} has no episodes of that iteration; "
                          f"it has iterations {shown}")
    records = by_iteration[iteration]
    out = run / "report"
    try:
        out.mkdir(exist_ok=True)
    except OSError as e:
        raise ReportError(f"cannot create {out}: {e.strerror or e}; make the run directory writable") from None
    name = run.resolve().name
    whitened = any(r.get("whitened") for r in records)
    images = [("Â over tokens, one row per episode" + (" (after whitening)" if whitened else ""),
               plot_credit(records, out / "credit.png", f"{name}: Â per token, iteration {iteration}"))]
    notes = []
    metrics = run / "metrics.jsonl"
    if metrics.is_file():
        try:
            images.append(("Diagnostics (metrics.jsonl)", plot_run(metrics, out / "diagnostics.png", title=name)))
            if any(isinstance(r.get("gold_score"), (int, float)) for r in read_metrics(metrics)):
                images.append(("Proxy vs gold reward", plot_proxy_vs_gold(metrics, out / "proxy_vs_gold.png")))
        except PlotError as e:
            notes.append(f"No diagnostics plot: {e}")
    else:
        notes.append(f"No diagnostics plot: {metrics} does not exist.")
    page = out / "index.html"
    text = render_page(name, iteration, iterations, records, images, notes, PER_TOKEN_KEYS)
    try:
        page.write_text(text, encoding="utf-8")
    except OSError as e:
        raise ReportError(f"cannot write {page}: {e.strerror or e}") from None
    return page
