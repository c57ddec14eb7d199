"""``ppo-lm report RUN_DIR [--iteration N]``: a run's token-level credit as one HTML page (docs/report.md),
written by :func:`ppo_lm.reporting.credit_report.build_report` under RUN_DIR/report/."""

from __future__ import annotations

from pathlib import Path

from ..reporting.credit_report import build_report
from ..runtime.errors import ArgumentParser


def report_command(argv: list[str]) -> Path:
    p = ArgumentParser(prog="ppo-lm report", description="A run's token-level credit (advantages, TD residuals, "
                       "values, KL, ratios of sampled episodes) as RUN_DIR/report/index.html, with credit.png "
                       "and the diagnostics plots.")
    p.add_argument("run_dir", help="a train run's OUTPUT_DIR (with credit.jsonl)")
    p.add_argument("--iteration", type=int, default=None,
                   help="the iteration whose sampled episodes to show (default: the last one)")
    a = p.parse_args(argv)
    page = build_report(a.run_dir, a.iteration)
    print(page, flush=True)
    return page


def cmd_report(argv: list[str]) -> int:
    from .main import _run

    return _run(lambda: report_command(argv))
