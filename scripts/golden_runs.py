"""Golden runs: short seeded trainings whose metrics and final weights a refactor must leave bit for bit
as they were (docs/architecture.md). Record them before a change, check them after, on the same host
(a different CPU may round differently, and one different logit changes a sampled token):

    python scripts/golden_runs.py record /tmp/golden.json      # before
    python scripts/golden_runs.py check /tmp/golden.json       # after: "equal", or what differs

Each run is a fresh `ppo-lm train` process on the built-in task (or under torchrun, two gloo ranks);
what is compared: every metric of metrics.jsonl except wall times, and the SHA-256 of each model file
of the last checkpoint (its manifest.json).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

TINY = ["--model.builtin-hidden-size", "32", "--data.builtin-num-prompts", "64", "--rollout.num-prompts", "8",
        "--log.no-tensorboard", "--log.no-progress", "--log.save-every", "1", "--threads", "1"]
SEPARATE = ["--critic.kind", "separate"]  # pinned: the built-in model's `auto` critic changed on 2026-12-06
RUNS: dict[str, list[str]] = {
    "gae": ["--iterations", "3", *SEPARATE],
    "grpo-groups": ["--iterations", "3", "--algo.estimator", "grpo", "--rollout.samples-per-prompt", "4"],
    "multi-turn": ["--iterations", "3", "--rollout.env", "builtin:equations_retry", "--rollout.max-turns", "3",
                   *SEPARATE],
    "lora": ["--iterations", "3", "--model.lora-r", "4", *SEPARATE],
    "eval": ["--iterations", "2", "--data.eval-prompts", "builtin:equations", "--data.builtin-eval-prompts", "16",
             "--log.eval-every", "1", *SEPARATE],
    "multi-turn-eval": ["--iterations", "2", "--rollout.env", "builtin:equations_retry", "--rollout.max-turns", "2",
                        "--data.eval-prompts", "builtin:equations", "--data.builtin-eval-prompts", "8",
                        "--log.eval-every", "1", "--log.eval-samples", "2", *SEPARATE],
    "sampler-logp": ["--iterations", "3", "--rollout.logp-from-sampler", "true", *SEPARATE],
    "shared-critic": ["--iterations", "3", "--critic.kind", "shared", "--critic.value-grad-scale", "1.0",
                      "--rollout.missing-eos-penalty", "0.5"],
    "shared-head": ["--iterations", "3", "--critic.kind", "shared", "--critic.value-grad-scale", "0.0"],
}
RESUMED = "resume"  # "gae" stopped after 2 iterations, then resumed to 3
TWO_RANKS = "two-ranks"


def _train(args: list[str], out: Path, *, ranks: int = 1) -> None:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    if ranks == 1:
        cmd = [sys.executable, "-m", "ppo_lm", "train", *TINY, *args, "--output-dir", str(out)]
    else:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(ranks), "--master-addr",
               "127.0.0.1", "--master-port", str(port), "-m", "ppo_lm", "train", *TINY, *args, "--output-dir",
               str(out)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if done.returncode:
        sys.exit(f"{' '.join(cmd)} failed:\n{done.stderr[-3000:]}")


def _record(out: Path) -> dict:
    """The run's metrics without wall times, and its last checkpoint's model files by SHA-256."""
    metrics = []
    for line in (out / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        metrics.append({k: v for k, v in row.items() if not k.endswith(("_s", "_per_s"))})
    last = sorted((out / "checkpoints").glob("iter_*"))[-1]
    files = json.loads((last / "manifest.json").read_text())["files"]
    weights = {name: f["sha256"] for name, f in files.items() if name.endswith((".safetensors", ".bin"))}
    return {"metrics": metrics, "weights": weights}


def run_all(names: list[str]) -> dict:
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for name in names:
            print(f"  {name}", flush=True)
            if name == RESUMED:
                _train(["--iterations", "2", *SEPARATE], root / name)
                _train(["--iterations", "3", "--resume", *SEPARATE], root / name)
            elif name == TWO_RANKS:
                _train(["--iterations", "2", *SEPARATE], root / name, ranks=2)
            else:
                _train(RUNS[name], root / name)
            out[name] = _record(root / name)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("action", choices=["record", "check"])
    p.add_argument("file")
    p.add_argument("--only", default=None, help="comma-separated run names (default: all)")
    a = p.parse_args(argv)
    names = a.only.split(",") if a.only else [*RUNS, RESUMED, TWO_RANKS]
    got = run_all(names)
    if a.action == "record":
        Path(a.file).write_text(json.dumps(got, indent=1))
        print(f"recorded {len(got)} runs in {a.file}")
        return 0
    want = json.loads(Path(a.file).read_text())
    bad = [name for name in names if got[name] != want.get(name)]
    for name in bad:
        w, g = want.get(name, {}), got[name]
        for i, (mw, mg) in enumerate(zip(w.get("metrics", []), g["metrics"])):
            diff = {k: (mw.get(k), mg.get(k)) for k in set(mw) | set(mg) if mw.get(k) != mg.get(k)}
            if diff:
                print(f"{name}: metrics row {i} differs: {dict(list(diff.items())[:6])}")
                break
        if w.get("weights") != g["weights"]:
            print(f"{name}: the final weights differ")
    print("equal" if not bad else f"{len(bad)} of {len(names)} runs differ: {', '.join(bad)}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
