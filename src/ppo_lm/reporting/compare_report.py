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
    ("explained_variance", "critic's explained variance"),
]
"""The panels of curves.png: a metrics.jsonl key and its title (a run without a critic logs no
explained variance and draws no line on that panel)."""

EV_LEARNS = 0.1
"""A reporting mark, not a guarantee: the explained variance from which the critic's baseline is
counted as telling episodes apart rather than tracking the mean return (docs/critic.md)."""


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
    ``response_length_mean`` × episodes), its training seconds (Σ ``iteration_s`` + ``eval_s``: the
    process's start-up and model loading left out), and its curves against the cumulative sampled tokens
    (``curves``) and against the cumulative training seconds (``wall_curves``)."""
    rows = read_metrics(metrics_path)
    its = sorted((r for r in rows if isinstance(r.get("iteration"), int) and r["iteration"] >= 1),
                 key=lambda r: r["iteration"])
    evals = [r for r in rows if isinstance(r.get("eval_score"), (int, float))]
    before = next((r["eval_score"] for r in evals if r.get("iteration") == 0), None)
    if not its or before is None or "eval_score" not in its[-1]:
        raise ValueError(f"{metrics_path} does not hold a finished run with held-out evaluations before and after")
    tokens, seconds = 0.0, sum(r.get("eval_s", 0.0) for r in rows if r.get("iteration") == 0)
    cum, wall = {0: 0.0}, {0: seconds}
    for r in its:
        tokens += r["response_length_mean"] * episodes_per_iteration
        seconds += r.get("iteration_s", 0.0) + r.get("eval_s", 0.0)
        cum[r["iteration"]], wall[r["iteration"]] = tokens, seconds

    def curve(key: str, x: dict[int, float]) -> list[list[float]]:
        return [[x[r["iteration"]], r[key]] for r in (evals if key == "eval_score" else its)
                if isinstance(r.get(key), (int, float))]

    return {"accuracy_before": before, "accuracy_after": its[-1]["eval_score"], "iterations": its[-1]["iteration"],
            "sampled_tokens": round(tokens), "train_s": seconds,
            "curves": {key: curve(key, cum) for key, _ in CURVES},
            "wall_curves": {key: curve(key, wall) for key, _ in CURVES},
            "critic": critic_record(its)}


def critic_record(its: list[dict]) -> dict | None:
    """The critic's diagnostics of one run, from its iterations' metrics (None for a run without a
    critic, which logs no ``explained_variance``): the mean explained variance and value loss over the
    last eighth of the iterations with a finite explained variance (50 of 400; at least one), and the
    first iteration whose explained variance reaches :data:`EV_LEARNS` (None if none does) — where the
    critic's baseline starts to tell episodes apart rather than track the mean return. An iteration
    whose returns did not vary logs no explained variance (null); a run with none is all None."""
    if not any("explained_variance" in r for r in its):
        return None
    rows = [r for r in its if isinstance(r.get("explained_variance"), (int, float))
            and math.isfinite(r["explained_variance"])]
    if not rows:
        return {"explained_variance_late": None, "value_loss_late": None, "late_iterations": None,
                "first_learns": None}
    late = rows[-max(1, len(rows) // 8):]
    return {"explained_variance_late": sum(r["explained_variance"] for r in late) / len(late),
            "value_loss_late": sum(r.get("value_loss", math.nan) for r in late) / len(late),
            "late_iterations": [late[0]["iteration"], late[-1]["iteration"]],
            "first_learns": next((r["iteration"] for r in rows if r["explained_variance"] >= EV_LEARNS), None)}


def value_at(curve: list[list[float]], x: float) -> float:
    """The curve's value at ``x`` ([[x, y], …], x ascending), linear between its two nearest points;
    its first value before its first point and its last after its last."""
    if not curve:
        raise ValueError("value of an empty curve")
    if x <= curve[0][0]:
        return curve[0][1]
    for (x0, y0), (x1, y1) in zip(curve, curve[1:]):
        if x <= x1:
            return y0 if x1 == x0 else y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return curve[-1][1]


BUDGETS = {"seconds": ("wall_curves", "train_s"), "tokens": ("curves", "sampled_tokens")}
"""The equal budgets of :func:`equal_budgets`: each run's held-out curve against training seconds
(start-up and model loading left out) or against sampled tokens, and the run's total of that axis."""


def equal_budgets(runs: list[dict]) -> dict[str, dict]:
    """Every estimator's held-out score where the run with the smallest budget ended, for each axis of
    :data:`BUDGETS`: ``at`` (the budget: that run's training seconds or sampled tokens), ``run`` (which
    run ended first) and, per estimator, the spread over its seeds of its held-out curve at ``at``,
    interpolated linearly between its evaluations (:func:`value_at`). Per second a critic's cost
    shows; per token its credit does (docs/critic.md)."""
    out: dict[str, dict] = {}
    names = dict.fromkeys(r["estimator"] for r in runs)
    for axis, (curves, total) in BUDGETS.items():
        first = min(runs, key=lambda r: r[total])
        at = first[total]
        out[axis] = {"at": at, "run": f"{first['estimator']}-seed{first['seed']}",
                     "estimators": {n: spread([value_at(r[curves]["eval_score"], at) for r in runs
                                               if r["estimator"] == n]) for n in names}}
    return out


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
        critics = [r.get("critic") for r in mine]
        if all(critics):
            late = [c["explained_variance_late"] for c in critics if c["explained_variance_late"] is not None]
            out[name]["explained_variance_late"] = spread(late) if late else None
            out[name]["first_learns"] = [c["first_learns"] for c in critics]
    return out


def _pm(s: dict, scale: float, fmt: str) -> str:
    """``mean ± std`` of a spread; the mean alone for one seed, whose spread is unknown, not zero."""
    mean = format(scale * s["mean"], fmt)
    return mean if s["n"] < 2 else f"{mean} ± {format(scale * s['std'], fmt.lstrip('+'))}"


def _pct(s: dict) -> str:
    return f"{_pm(s, 100, '.1f')} %"


def _tokens(n: float) -> str:
    return f"{n / 1e6:.2f} M" if n >= 1e6 else f"{n / 1e3:.1f} k" if n >= 1e3 else f"{n:.0f}"


def _critic_cell(e: dict) -> str:
    """The explained variance over the last eighth of the run (mean over the seeds where it is
    defined), and per seed the first iteration it reached :data:`EV_LEARNS` ("never" where it did not);
    "—" for an estimator without a critic."""
    if "explained_variance_late" not in e:
        return "—"
    if e["explained_variance_late"] is None:
        return "undefined: the returns never varied"
    firsts = " / ".join("never" if f is None else str(f) for f in e["first_learns"])
    return f"{_pm(e['explained_variance_late'], 1, '.2f')}; first ≥ {EV_LEARNS} at iteration {firsts}"


def held_out_value(value: float, env: str | None) -> str:
    """One held-out number as the table writes it: an accuracy in percent, or with an environment a mean
    return in the environment's own units (a return of 2.5 is not 250 %)."""
    return f"{value:.3f}" if env else f"{value:.1%}"


def _held_out_cells(e: dict, env: str | None) -> list[str]:
    """Before, after and gain: percent and percentage points, or mean returns and their difference."""
    if env:
        return [_pm(e["accuracy_before"], 1, ".3f"), _pm(e["accuracy_after"], 1, ".3f"), _pm(e["gain"], 1, "+.3f")]
    return [_pct(e["accuracy_before"]), _pct(e["accuracy_after"]), _pm(e["gain"], 100, "+.1f")]


def _budget(s: dict) -> str:
    """The per-run budget; the response limit only where it is a number (``auto`` is resolved by each
    run from its policy's size, which the comparison does not load)."""
    limit = s.get("max_new_tokens")
    tokens = f" × ≤ {limit} tokens{' a turn' if s.get('env') else ''}" if isinstance(limit, int) else ""
    layout = {"natural": "each estimator in its own layout", "common": "one layout for every estimator"}
    return (f"{s['iterations']} iterations × {s['episodes']} episodes ({layout[s['layout']]}: prompts × samples "
            f"per prompt below){tokens} for every run")


def _seconds(x: float) -> str:
    """Seconds as the table writes them: whole above 10, two significant digits below (a smoke run's)."""
    return f"{x:.0f}" if x >= 10 else f"{x:.2g}"


def _budget_cells(summary: dict, name: str, env: str | None) -> list[str]:
    """The held-out cells at equal sampled tokens and at equal training seconds (summary.json's
    ``equal_budgets``); none for a summary without them."""
    eq = summary.get("equal_budgets")
    if not eq:
        return []
    scale, fmt, unit = (1, ".3f", "") if env else (100, ".1f", " %")
    return [f"{_pm(eq[axis]['estimators'][name], scale, fmt)}{unit}" for axis in ("tokens", "seconds")]


def _budget_note(summary: dict) -> str:
    eq = summary.get("equal_budgets")
    if not eq:
        return ""
    t, sec = eq["tokens"], eq["seconds"]
    return (f"\nAt equal budgets: each run's held-out curve read at {_tokens(t['at'])} sampled tokens (where "
            f"{t['run']} ended) and at {_seconds(sec['at'])} s of training (where {sec['run']} ended; training seconds "
            "leave out the process's start-up and model loading), interpolated linearly between the held-out "
            "evaluations, so a value between two evaluations is an estimate.\n")


def _hosts_note(summary: dict) -> str:
    """A comparison continued with --resume on another machine: its wall times mix hosts."""
    runs = summary.get("runs") or []
    cpus = sorted({r["cpu"] for r in runs if r.get("cpu")})
    if len(cpus) < 2:
        return ""
    return (f"\nThe runs ran on {len(cpus)} different CPUs ({'; '.join(cpus)}; each run's `cpu` in summary.json): "
            "wall times and the column at equal seconds compare hosts as well as estimators.\n")


def summary_markdown(summary: dict) -> str:
    """The comparison table: one row per estimator, mean ± sample std over the seeds; with
    ``equal_budgets`` (:func:`equal_budgets`) two more columns, held-out at equal sampled tokens and
    at equal training seconds."""
    s = summary["settings"]
    env = s.get("env")
    eq = summary.get("equal_budgets")
    what = "mean return" if env else "accuracy"
    budget_heads = (f" held-out {what} at {_tokens(eq['tokens']['at'])} tokens | at {_seconds(eq['seconds']['at'])} s |"
                    if eq else "")
    k = s.get("eval_samples", 1)
    held_out = (f"environment {env}; held-out mean return: "
                + ("greedy episodes" if k == 1 else f"{k} sampled episodes a prompt") if env else
                "held-out accuracy: " + ("greedy" if k == 1 else f"the mean of {k} sampled responses a prompt"))
    lines = [
        f"# ppo-lm compare: {', '.join(summary['estimators'])}",
        "",
        f"{_budget(s)}; start: {s['policy']}; {held_out}, on {s['eval_prompts']}; seeds "
        f"{', '.join(map(str, s['seeds']))}. Each cell: mean ± sample standard deviation over the seeds "
        "(summary.json also has the minimum and maximum)" +
        (", the mean alone where one seed ran." if len(s["seeds"]) < 2 else "."),
        "",
        f"| estimator | prompts × samples | held-out {'mean return' if env else 'accuracy'} before | after | "
        f"gain ({'return' if env else 'points'}) | sampled tokens per run | wall time per run | peak RSS per run "
        f"|{budget_heads} models held | critic's explained variance, last 1/8 of the run |",
        "|---|---|---|---|---|---|---|---|" + ("---|---|" if eq else "") + "---|---|",
    ]
    for name, e in summary["estimators"].items():
        models = e["models_held"]
        prompts, samples = s["layouts"][name]
        lines.append(
            f"| {name} | {prompts} × {samples} | {' | '.join(_held_out_cells(e, env))} | "
            f"{_tokens(e['sampled_tokens']['mean'])} | {_pm(e['wall_s'], 1, '.0f')} s | "
            f"{e['peak_rss_mb']['mean']:.0f} MB | {''.join(c + ' | ' for c in _budget_cells(summary, name, env))}"
            f"{len(models)} ({', '.join(models)}) | {_critic_cell(e)} |")
    return "\n".join(lines) + "\n" + _budget_note(summary) + _hosts_note(summary)


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


def _draw(ax, curves: list[list[list[float]]], key: str, label: str, color: str, scale: float) -> None:
    """One estimator's band over seeds on one panel: per-iteration values smoothed over 1/15 of the run,
    held-out evaluations as they are, with markers."""
    xs, mean, lo, hi = band(curves)
    if key != "eval_score":
        w = max(1, len(xs) // 15)
        mean, lo, hi = smooth(mean, w), smooth(lo, w), smooth(hi, w)
    x = [v / scale for v in xs]
    ax.plot(x, mean, label=label, color=color, marker="o" if key == "eval_score" else None, markersize=3,
            linewidth=1.2)
    ax.fill_between(x, lo, hi, color=color, alpha=0.2, linewidth=0)


def plot_curves(runs: list[dict], out_png: str | Path, title: str = "", *, env: str | None = None) -> Path:
    """curves.png: a panel per :data:`CURVES` key against the cumulative sampled tokens (top row) and
    against the cumulative training seconds (bottom row: the critic costs time), one line per estimator
    (the mean over seeds) with a band from the minimum to the maximum over seeds. The per-iteration
    curves are smoothed over a trailing window of 1/15 of the run (one iteration's score of 128
    episodes is noisy); the held-out evaluations are drawn as they are, with markers. With ``env`` the
    held-out panel is the greedy episodes' mean return."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, len(CURVES), figsize=(3.4 * len(CURVES), 5.4), squeeze=False)
    estimators = list(dict.fromkeys(r["estimator"] for r in runs))
    for row, (which, xlabel, scale) in enumerate((("curves", "sampled tokens (millions)", 1e6),
                                                   ("wall_curves", "training time (s)", 1.0))):
        for ax, (key, name) in zip(axes[row], CURVES):
            for i, est in enumerate(estimators):
                curves = [r[which][key] for r in runs if r["estimator"] == est and r[which][key]]
                if curves:
                    _draw(ax, curves, key, est, f"C{i}", scale)
            ax.set_title("held-out mean return (greedy)" if env and key == "eval_score" else name, fontsize=10)
            ax.set_xlabel(xlabel, fontsize=8)
            ax.tick_params(labelsize=8)
    axes[0][0].legend(fontsize=8)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    out = Path(out_png)
    _save(fig, out)
    return out
