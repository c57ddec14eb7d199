"""PNG plots of the per-iteration diagnostics in a run's metrics.jsonl (matplotlib, no display)."""

from __future__ import annotations

import json
import math
from pathlib import Path

PANELS: list[tuple[str, list[str]]] = [
    ("score", ["score", "gold_score", "heldout_accuracy"]),
    ("ref KL (per response)", ["ref_kl"]),
    ("β (KL coefficient)", ["kl_coef"]),
    ("value loss", ["value_loss"]),
    ("explained variance", ["explained_variance"]),
    ("clip fraction", ["policy_clip_frac", "value_clip_frac"]),
    ("entropy", ["entropy"]),
    ("response length", ["response_length_mean", "response_length_max"]),
    ("approx KL old/new", ["approx_kl"]),
]


def read_metrics(path: str | Path) -> list[dict]:
    rows = []
    for line in Path(path).read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


def plot_run(metrics_path: str | Path, out_png: str | Path, title: str = "") -> Path:
    """One figure with a panel per diagnostic that the run logged; returns the PNG path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = read_metrics(metrics_path)
    panels = [(name, [k for k in keys if any(r.get(k) is not None for r in rows)]) for name, keys in PANELS]
    panels = [(n, ks) for n, ks in panels if ks]
    cols = 3
    nrows = max(1, math.ceil(len(panels) / cols))
    fig, axes = plt.subplots(nrows, cols, figsize=(4.2 * cols, 2.8 * nrows), squeeze=False)
    for ax, (name, keys) in zip(axes.flat, panels):
        for k in keys:
            pts = [(r["iteration"], r[k]) for r in rows if r.get(k) is not None]
            marker = "o" if len(pts) < 30 or k == "heldout_accuracy" else None
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
    out = Path(out_png)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def plot_proxy_vs_gold(metrics_path: str | Path, out_png: str | Path) -> Path:
    """Reward-model (proxy) score and verifier (gold) score over iterations, on twin axes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = read_metrics(metrics_path)
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
    out = Path(out_png)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
