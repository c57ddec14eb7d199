"""What `ppo-lm compare` writes from its finished runs: per-run records read from each run's
metrics.jsonl, per-estimator spreads over seeds, the summary.md table and curves.png.

Pure functions of the runs' files and numbers, so the tests check them against hand calculations.
"""

from __future__ import annotations

import math
from pathlib import Path

from .plots import _save, read_metrics

CURVES: list[tuple[str, str]] = [
    ("score", "training score (sampled)"),
    ("eval_score", "held-out accuracy (greedy)"),
    ("ref_kl", "KL(π ‖ π_ref) per response"),
    ("response_length_mean", "response length (tokens)"),
]
"""The panels of curves.png: a metrics.jsonl key and its title."""


def spread(values: list[float]) -> dict[str, float]:
    """Mean, sample standard deviation (n − 1 in the denominator; 0 for one value), minimum and maximum
    of ``values`` (the runs of one estimator over the seeds)."""
    n = len(values)
    if n == 0:
        raise ValueError("spread of no values")
    mean = sum(values) / n
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1)) if n > 1 else 0.0
    return {"mean": mean, "std": std, "min": min(values), "max": max(values), "n": n}


def run_record(metrics_path: str | Path, episodes_per_iteration: int) -> dict:
    """One run's numbers from its metrics.jsonl: held-out accuracy before training (the evaluation logged
    as iteration 0) and after the last iteration, the sampled response tokens (Σ over iterations of
    ``response_length_mean`` × episodes), and its curves against the cumulative sampled tokens."""
    rows = read_metrics(metrics_path)
    its = sorted((r for r in rows if isinstance(r.get("iteration"), int) and r["iteration"] >= 1),
                 key=lambda r: r["iteration"])
    evals = [r for r in rows if isinstance(r.get("eval_score"), (int, float))]
    before = next((r["eval_score"] for r in evals if r.get("iteration") == 0), None)
    if not its or before is None or "eval_score" not in its[-1]:
        raise ValueError(f"{metrics_path} does not hold a finished run with held-out evaluations before and after")
    tokens, cum = 0.0, {0: 0.0}
    for r in its:
        tokens += r["response_length_mean"] * episodes_per_iteration
        cum[r["iteration"]] = tokens
    curves = {key: [[cum[r["iteration"]], r[key]] for r in (evals if key == "eval_score" else its)
                    if isinstance(r.get(key), (int, float))]
              for key, _ in CURVES}
    return {"accuracy_before": before, "accuracy_after": its[-1]["eval_score"], "iterations": its[-1]["iteration"],
            "sampled_tokens": round(tokens), "train_s": sum(r.get("iteration_s", 0.0) + r.get("eval_s", 0.0) for r in rows),
            "curves": curves}


def summarize(runs: list[dict]) -> dict[str, dict]:
    """Per estimator (in the order of ``runs``): the spread over its seeds of each measured number, and
    the models it holds."""
    out: dict[str, dict] = {}
    for name in dict.fromkeys(r["estimator"] for r in runs):
        mine = [r for r in runs if r["estimator"] == name]
        out[name] = {key: spread([r[key] for r in mine]) for key in
                     ("accuracy_before", "accuracy_after", "sampled_tokens", "wall_s", "peak_rss_mb")}
        out[name]["gain"] = spread([r["accuracy_after"] - r["accuracy_before"] for r in mine])
        out[name]["seeds"] = [r["seed"] for r in mine]
        out[name]["models_held"] = mine[0]["models_held"]
    return out


def _pct(s: dict) -> str:
    return f"{100 * s['mean']:.1f} ± {100 * s['std']:.1f} %"


def _tokens(n: float) -> str:
    return f"{n / 1e6:.2f} M" if n >= 1e6 else f"{n / 1e3:.1f} k" if n >= 1e3 else f"{n:.0f}"


def summary_markdown(summary: dict) -> str:
    """The comparison table: one row per estimator, mean ± sample std over the seeds."""
    s = summary["settings"]
    lines = [
        f"# ppo-lm compare: {', '.join(summary['estimators'])}",
        "",
        f"{s['iterations']} iterations × {s['num_prompts']} prompts × {s['samples_per_prompt']} samples × "
        f"≤ {s['max_new_tokens']} tokens for every run; start: {s['policy']}; held-out accuracy: greedy, on "
        f"{s['eval_prompts']}; seeds {', '.join(map(str, s['seeds']))}. Each cell: mean ± sample "
        "standard deviation over the seeds (summary.json also has the minimum and maximum).",
        "",
        "| estimator | held-out accuracy before | after | gain (points) | sampled tokens per run | wall time per run "
        "| peak RSS per run | models held |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, e in summary["estimators"].items():
        g = e["gain"]
        models = e["models_held"]
        lines.append(
            f"| {name} | {_pct(e['accuracy_before'])} | {_pct(e['accuracy_after'])} | "
            f"{100 * g['mean']:+.1f} ± {100 * g['std']:.1f} | {_tokens(e['sampled_tokens']['mean'])} | "
            f"{e['wall_s']['mean']:.0f} ± {e['wall_s']['std']:.0f} s | {e['peak_rss_mb']['mean']:.0f} MB | "
            f"{len(models)} ({', '.join(models)}) |")
    return "\n".join(lines) + "\n"


def smooth(values: list[float], window: int) -> list[float]:
    """Trailing moving average over ``window`` points (fewer at the start)."""
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


def band(curves: list[list[list[float]]]) -> tuple[list[float], list[float], list[float], list[float]]:
    """Seeds' curves of one estimator ([[tokens, value], …] each) aligned by position (the same iterations):
    x = the mean of their cumulative tokens, the mean value, and the minimum and maximum over the seeds."""
    n = min(len(c) for c in curves)
    cols = [[c[i] for c in curves] for i in range(n)]
    xs = [sum(p[0] for p in col) / len(col) for col in cols]
    ys = [[p[1] for p in col] for col in cols]
    return xs, [sum(y) / len(y) for y in ys], [min(y) for y in ys], [max(y) for y in ys]


def plot_curves(runs: list[dict], out_png: str | Path, title: str = "") -> Path:
    """curves.png: a panel per :data:`CURVES` key against the cumulative sampled tokens, one line per
    estimator (the mean over seeds) with a band from the minimum to the maximum over seeds. The
    per-iteration curves are smoothed over a trailing window of 1/15 of the run (one iteration's
    score of 128 episodes is noisy); the held-out evaluations are drawn as they are, with markers."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(CURVES), figsize=(3.4 * len(CURVES), 2.8), squeeze=False)
    for ax, (key, name) in zip(axes[0], CURVES):
        for est in dict.fromkeys(r["estimator"] for r in runs):
            curves = [r["curves"][key] for r in runs if r["estimator"] == est and r["curves"][key]]
            if not curves:
                continue
            xs, mean, lo, hi = band(curves)
            if key != "eval_score":
                w = max(1, len(xs) // 15)
                mean, lo, hi = smooth(mean, w), smooth(lo, w), smooth(hi, w)
            line, = ax.plot([x / 1e6 for x in xs], mean, label=est, marker="o" if key == "eval_score" else None,
                            markersize=3, linewidth=1.2)
            ax.fill_between([x / 1e6 for x in xs], lo, hi, color=line.get_color(), alpha=0.2, linewidth=0)
        ax.set_title(name, fontsize=10)
        ax.set_xlabel("sampled tokens (millions)", fontsize=8)
        ax.tick_params(labelsize=8)
    axes[0][0].legend(fontsize=8)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    out = Path(out_png)
    _save(fig, out)
    return out
