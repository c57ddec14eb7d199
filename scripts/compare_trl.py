"""Side-by-side W1 throughput: TRL's PPO (``shared/bench/trl_ppo_w1.py``) and ``ppo-lm bench``, run as
back-to-back pairs so host drift cancels in each pair's ratio.

    python scripts/compare_trl.py --trl-python /tmp/trlvenv/bin/python --pairs 3 \
        --variant= --variant=--compile-kernels

Each pair runs TRL, then ``ppo-lm bench`` once per ``--variant`` (extra bench flags; default: none).

Before each run it waits until the CPUs have been > 90 % idle for 8 s (other jobs share the machine)
and it reports the share of CPU time other processes (and the hypervisor) used during the run.
Prints one JSON line per run and a summary with the median episodes/s ratio and the peak-RSS ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from ppo_lm.cli.bench import host_cpu, host_load

ROOT = Path(__file__).resolve().parent.parent


def wait_until_idle(seconds: float = 8.0, max_busy: float = 0.10, give_up_s: float = 300.0) -> None:
    start = time.time()
    while time.time() - start < give_up_s:
        c0 = host_cpu()
        time.sleep(seconds)
        c1 = host_cpu()
        if c0 is None or c1 is None:
            return  # no counters (not Linux): nothing to wait for
        used = (c1.busy + c1.steal) - (c0.busy + c0.steal)
        if used / max(c1.total - c0.total, 1) <= max_busy:
            return
    print("warning: the machine never became idle; measuring anyway", file=sys.stderr)


def run(cmd: list[str], env: dict) -> dict:
    """Run one benchmark; returns its JSON line plus ``run_other_cpu_share`` and ``run_steal_share``
    (CPU time other processes and the hypervisor took during the whole run, build included, as
    shares of the machine's CPU time; ``ppo-lm bench`` also reports its own over the timed
    iterations)."""
    wait_until_idle()
    c0, own0 = host_cpu(), os.times()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    own1, c1 = os.times(), host_cpu()
    if proc.returncode:
        raise SystemExit(f"{cmd[0]} failed:\n{proc.stderr[-3000:]}")
    line = [x for x in proc.stdout.splitlines() if x.startswith("{")][-1]
    result = json.loads(line)
    own_s = own1.children_user - own0.children_user + own1.children_system - own0.children_system
    result.update({f"run_{k}": v for k, v in host_load(c0, c1, own_s).items()})
    print(json.dumps(result), flush=True)
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trl-python", required=True, help="python of a venv with torch==2.13.0 trl==0.29.1 datasets")
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--iterations", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--variant", action="append", default=None,
                    help="extra ppo-lm bench flags, e.g. '--compile-kernels' (repeatable; default: one plain run)")
    ap.add_argument("--trl-script", default=str(ROOT.parent / "shared" / "bench" / "trl_ppo_w1.py"))
    args = ap.parse_args()
    env = dict(os.environ, W1_ITERS=str(args.iterations), W1_THREADS=str(args.threads),
               OMP_NUM_THREADS=str(args.threads), TOKENIZERS_PARALLELISM="false")
    ours_cmd = [sys.executable, "-m", "ppo_lm", "bench", "--workload", "w1", "--iterations", str(args.iterations),
                "--threads", str(args.threads), "--json"]
    variants = args.variant or [""]
    pairs = []
    for _ in range(args.pairs):
        trl = run([args.trl_python, args.trl_script], env)
        pairs.append((trl, [run(ours_cmd + v.split(), env) for v in variants]))
    summary: dict = {"pairs": len(pairs), "trl_s_per_iteration": [t["s_per_iteration"] for t, _ in pairs]}
    for i, v in enumerate(variants):
        ratios = [o[i]["episodes_per_s"] / t["episodes_per_s"] for t, o in pairs]
        rss = [o[i]["peak_rss_mb"] / t["peak_rss_mb"] for t, o in pairs]
        summary[v or "default"] = {
            "ppo_lm_s_per_iteration": [o[i]["s_per_iteration"] for _, o in pairs],
            "episodes_per_s_ratio": [round(r, 3) for r in ratios],
            "median_ratio": round(statistics.median(ratios), 3),
            "peak_rss_ratio": round(statistics.median(rss), 3),
        }
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
