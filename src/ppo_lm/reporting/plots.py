"""PNG plots of the per-iteration diagnostics in a run's metrics.jsonl (matplotlib, no display)."""

from __future__ import annotations

import json
import math
from pathlib import Path

from ..runtime.errors import UserError

PANELS: list[tuple[str, list[str]]] = [
    ("score", ["score", "gold_score", "heldout_accuracy", "eval_score", "eval_pass_at_k"]),
    ("ref KL (per response)", ["ref_kl"]),
    ("β (KL coefficient)", ["kl_coef"]),
    ("value loss", ["value_loss"]),
    ("explained variance", ["explained_variance"]),
    ("clip fraction", ["policy_clip_frac", "value_clip_frac"]),
    ("entropy", ["entropy"]),
    ("response length", ["response_length_mean", "response_length_max"]),
    ("approx KL old/new", ["approx_kl"]),
]


SPARSE = ("heldout_accuracy", "eval_score", "eval_pass_at_k")
"""Logged every few iterations only (evaluations): drawn with markers."""


class PlotError(UserError):
    """Nothing to plot, or the PNG cannot be written; the message says which and the fix."""


def read_metrics(path: str | Path) -> list[dict]:
    """The JSON objects of a metrics.jsonl, one per line; lines that are not one (a line cut by a
    crash, a blank line) are skipped."""
    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError as e:
        raise PlotError(f"cannot read {path}: {e.strerror or e}") from None
    rows = []
    for line in text.splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(row, dict):
            rows.append(row)
    return rows


def _iteration(row: dict) -> bool:
    return isinstance(row.get("iteration"), (int, float)) and not isinstance(row.get("iteration"), bool)


def _plottable(row: dict, key: str) -> bool:
    v = row.get(key)
    return _iteration(row) and isinstance(v, (int, float)) and not isinstance(v, bool)


def _save(fig, out: Path) -> None:
    """``fig.savefig`` with a :class:`PlotError` for a path that cannot be written or a format
    matplotlib does not know (``out`` has its suffix already: see :func:`png_path`)."""
    import matplotlib.pyplot as plt

    try:
        fig.savefig(out, dpi=110)
    except (OSError, ValueError) as e:
        reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e).splitlines()[0]
        raise PlotError(f"cannot write the plot to {str(out)!r}: {reason}; choose another path") from None
    finally:
        plt.close(fig)


def png_path(out: str | Path) -> Path:
    """``out``, with ``.png`` added when it has no suffix (what matplotlib writes then)."""
    out = Path(out)
    return out if out.suffix else out.with_name(out.name + ".png")


def panels_of(rows: list[dict]) -> list[tuple[str, list[str]]]:
    """The panels of :data:`PANELS` that ``rows`` has values for, each with the keys it draws."""
    panels = [(name, [k for k in keys if any(_plottable(r, k) for r in rows)]) for name, keys in PANELS]
    return [(n, ks) for n, ks in panels if ks]


def plot_run(metrics_path: str | Path, out_png: str | Path, title: str = "") -> Path:
    """One figure with a panel per diagnostic that the run logged; returns the PNG path.

    Raises :class:`PlotError` when ``metrics_path`` holds no iteration with a plottable metric (an
    empty file, a run that has not finished an iteration) rather than drawing an empty figure.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = read_metrics(metrics_path)
    panels = panels_of(rows)
    if not panels:
        what = "is empty" if not rows else (f"has {len(rows)} line(s) but none with an `iteration` and a metric "
                                            f"that is plotted ({', '.join(keys[0] for _, keys in PANELS[:4])}, …)")
        raise PlotError(f"{metrics_path} {what}: nothing to plot; plot a run that has logged an iteration")
    cols = 3
    nrows = max(1, math.ceil(len(panels) / cols))
    fig, axes = plt.subplots(nrows, cols, figsize=(4.2 * cols, 2.8 * nrows), squeeze=False)
    for ax, (name, keys) in zip(axes.flat, panels):
        for k in keys:
            pts = [(r["iteration"], r[k]) for r in rows if _plottable(r, k)]
            marker = "o" if len(pts) < 30 or k in SPARSE else None
            ax.plot([p[0] for p in pts], [p[1] for p in pts], label=k, marker=marker, markersize=3)
        ax.set_title(name, fontsize=10)
        ax.set_xlabel("iteration", fontsize=8)
        ax.tick_params(labelsize=8)
        if len(keys) > 1:
            ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    out = png_path(out_png)
    _save(fig, out)
    return out


def plot_proxy_vs_gold(metrics_path: str | Path, out_png: str | Path) -> Path:
    """Reward-model (proxy) score and verifier (gold) score over iterations, on twin axes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in read_metrics(metrics_path) if _iteration(r)]
    if not rows:
        raise PlotError(f"{metrics_path} holds no iteration to plot")
    it = [r["iteration"] for r in rows]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(it, [r.get("score") for r in rows], color="tab:blue", label="proxy (reward model)")
    ax.set_ylabel("reward-model score", color="tab:blue")
    ax2 = ax.twinx()
    ax2.plot(it, [r.get("gold_score") for r in rows], color="tab:red", label="gold (verifier)")
    ax2.set_ylabel("verifier accuracy", color="tab:red")
    ax.set_xlabel("iteration")
    ax.set_title("proxy vs gold reward")
    fig.tight_layout()
    out = png_path(out_png)
    _save(fig, out)
    return out
