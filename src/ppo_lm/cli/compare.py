"""`ppo-lm compare`: advantage estimators side by side on the same task, start, budget and seeds.

Every run is `ppo-lm train` on the built-in equation task from one start (by default the SFT policy of
`ppo-lm demo`, built once under OUTPUT_DIR/sft), with the same prompts × samples × token limit per
iteration, the same iterations and the same seeds; only `algo.estimator` (and what it implies: a critic
or none, the KL in the reward or in the loss) differs. Each run is a fresh process, started one after
another, so its wall time and peak RSS are its own (docs/compare.md).
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..runtime.errors import ArgumentParser, UserError
from ..trainer.config import TrainConfig


def _compare_ppo() -> TrainConfig:
    """The demo's PPO stage with a group of samples per prompt, so every estimator, the group-based
    ones included, gets the same 128 episodes per iteration (32 prompts × 4 samples; GAE samples 4 per
    prompt too, so the budget and the prompts seen are the same)."""
    from .demo import demo_ppo

    cfg = demo_ppo()
    cfg.rollout.num_prompts = 32
    cfg.rollout.samples_per_prompt = 4
    cfg.threads = 2
    cfg.log.eval_every = 25
    cfg.log.save_every = 0  # one checkpoint at the end: the comparison never resumes
    cfg.log.report_to = []  # metrics.jsonl is the record; TensorBoard files would only cost time
    cfg.log.progress = False
    cfg.log.print_every = 25
    return cfg


@dataclass
class CompareConfig:
    estimators: list[str] = field(default_factory=lambda: ["gae", "grpo", "rloo", "reinforce++"])
    """Advantage estimators (`algo.estimator` names), each run with every seed."""
    iterations: int = 400
    """PPO iterations of every run (replaces the --config file's `iterations`)."""
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])
    """Seeds of the runs (`seed` of `ppo-lm train`: prompt order, sampling, shuffling)."""
    config: str | None = None
    """A `ppo-lm train` YAML file merged over the comparison's settings (`ppo`), for every run."""
    output_dir: str = "compare"
    """Where summary.json, summary.md, curves.png, sft/ and runs/ go."""
    overwrite: bool = False
    """Replace the outputs of an earlier comparison in output_dir (otherwise an error)."""
    policy: str | None = None
    """The start of every run (a checkpoint directory); None = the demo's SFT policy, built under
    OUTPUT_DIR/sft."""
    smoke: bool = False
    """Tiny sizes that run in seconds (wiring check, used by the tests)."""
    ppo: TrainConfig = field(default_factory=_compare_ppo)
    """The settings of every run; compare sets estimator, seed, iterations, output_dir, model and the
    held-out prompts."""

    def shrink(self) -> None:
        p = self.ppo
        p.rollout.num_prompts, p.rollout.samples_per_prompt, p.rollout.max_new_tokens = 4, 2, 4
        p.optim.epochs, p.optim.num_minibatches = 1, 1
        p.data.builtin_num_prompts = 32
        p.log.eval_every = 1


OUTPUTS = ("summary.json", "summary.md", "curves.png", "heldout.jsonl", "sft", "runs", "logs")


class CompareError(UserError):
    """A bad setting of `ppo-lm compare`, or a run of it that failed."""


def _csv(kind: type, what: str):
    def parse(text: str):
        items = [t.strip() for t in text.split(",")]
        if not all(items):
            raise ValueError
        values = [kind(t) for t in items]
        if len(set(values)) != len(values):
            raise ValueError
        return values

    parse.__name__ = what  # argparse names the type in "invalid … value"
    return parse


def parse_args(argv: list[str]) -> CompareConfig:
    d = CompareConfig()
    p = ArgumentParser(prog="ppo-lm compare", description="Advantage estimators side by side: the same task, start, "
                       "budget of sampled tokens and seeds; writes summary.json, summary.md and curves.png.")
    p.add_argument("--estimators", type=_csv(str, "comma-separated list"), default=d.estimators,
                   help=f"comma-separated, e.g. {','.join(d.estimators)} (the default)")
    p.add_argument("--iterations", type=int, default=d.iterations, help=f"iterations of every run ({d.iterations})")
    p.add_argument("--seeds", type=_csv(int, "comma-separated list of distinct integers"), default=d.seeds,
                   help=f"comma-separated, e.g. {','.join(map(str, d.seeds))} (the default)")
    p.add_argument("--config", default=None, help="a `ppo-lm train` YAML file merged over every run's settings")
    p.add_argument("--output-dir", "--output_dir", default=d.output_dir, help=f"default {d.output_dir}/")
    p.add_argument("--overwrite", action="store_true", help="replace an earlier comparison's outputs in --output-dir")
    p.add_argument("--policy", default=None, help="start of every run (default: the demo's SFT policy, built once)")
    p.add_argument("--smoke", action="store_true", help="tiny sizes that run in seconds (wiring check)")
    a = p.parse_args(argv)
    cfg = CompareConfig(estimators=a.estimators, iterations=a.iterations, seeds=a.seeds, config=a.config,
                        output_dir=a.output_dir, overwrite=a.overwrite, policy=a.policy, smoke=a.smoke)
    if cfg.smoke:
        cfg.shrink()
    return cfg


def check_compare(cfg: CompareConfig) -> None:
    """Everything that needs no model, before the first run: a mistake costs a second, not a run."""
    from ..algorithms.registry import ADVANTAGE_ESTIMATORS
    from ..runtime.errors import ConfigError
    from ..trainer.config_io import from_dict, load_saved_config, load_yaml
    from ..trainer.files import prepare_output_dir

    unknown = [e for e in cfg.estimators if e not in ADVANTAGE_ESTIMATORS]
    if unknown:
        raise CompareError(f"--estimators: unknown estimator(s) {', '.join(map(repr, unknown))}; choose from "
                           f"{', '.join(ADVANTAGE_ESTIMATORS)}")
    if cfg.iterations < 1:
        raise CompareError(f"--iterations must be >= 1, got {cfg.iterations}")
    if any(s < 0 for s in cfg.seeds):
        raise CompareError(f"--seeds must be >= 0, got {','.join(map(str, cfg.seeds))}")
    if cfg.config:
        load_yaml(cfg.config, TrainConfig)  # the file's own errors (missing, not YAML, unknown field)
        cfg.ppo = from_dict(TrainConfig, load_saved_config(cfg.config), base=cfg.ppo)
    if cfg.policy is not None and not Path(cfg.policy).is_dir():
        raise CompareError(f"--policy {cfg.policy!r} is not a directory; give a checkpoint directory (e.g. a demo's "
                           "sft/), or leave it out to start from the demo's SFT policy")
    for est in cfg.estimators:  # the trainer's own checks, per estimator, with the run's settings
        try:
            _validate(run_config(cfg, est, cfg.seeds[0]))
        except ConfigError as e:
            raise CompareError(f"estimator {est!r}: {e}") from None
    out = Path(cfg.output_dir)
    try:
        prepare_output_dir(out, "output_dir")
    except ValueError as e:
        raise CompareError(str(e)) from None
    found = [name for name in OUTPUTS if (out / name).exists()]
    if found and not cfg.overwrite:
        raise CompareError(f"`output_dir` {str(out)!r} already holds a comparison ({', '.join(found)}); pass "
                           "--overwrite to replace it, or choose another --output-dir")


def _validate(run: TrainConfig) -> None:
    from ..trainer.validate import validate_config

    validate_config(run, 1)


def run_config(cfg: CompareConfig, estimator: str, seed: int) -> TrainConfig:
    """The settings of one run: the comparison's (with --config merged) plus what varies."""
    out = Path(cfg.output_dir)
    run = copy.deepcopy(cfg.ppo)
    run.algo.estimator = estimator  # type: ignore[assignment]  # checked against the registry
    run.seed = seed
    run.iterations = cfg.iterations
    run.output_dir = str(out / "runs" / f"{estimator}-seed{seed}")
    start = cfg.policy or str(out / "sft")
    run.model.policy = start
    run.model.tokenizer = start
    if run.data.eval_prompts is None:
        run.data.eval_prompts = str(out / "heldout.jsonl")
    return run


def models_held(run: TrainConfig) -> list[str]:
    """The models a run holds in memory: the policy, its frozen reference (not a second copy with LoRA:
    the policy with its adapters off), a critic for estimators that need one (a separate model, or a
    value head on the policy), and each reward model of `model.reward`."""
    from ..algorithms.registry import get_advantage_estimator
    from ..trainer.builders import is_model_path, reward_specs

    held = ["policy"] if getattr(run.model, "lora_r", 0) else ["policy", "reference"]
    if get_advantage_estimator(run.algo.estimator).needs_critic:
        held.append("critic" if run.model.critic == "separate" else "value head")
    held += ["reward model" for spec, _ in reward_specs(run.model) if is_model_path(spec)]
    return held


def build_start(cfg: CompareConfig, out: Path) -> None:
    """The demo's SFT policy (its seed 0 and settings) under OUT/sft, and the demo's held-out equations
    (seed 0) in OUT/heldout.jsonl: one start and one evaluation set for every run."""
    import torch

    from ..stages.sft import SFTConfig, train_sft
    from ..tasks.equations import build_tiny_policy, build_tokenizer, make_prompts, sft_demonstrations
    from .demo import DemoConfig

    d = DemoConfig()
    if cfg.smoke:
        d.shrink()
    held = make_prompts(d.eval_prompts, seed=d.seed + 10_000, split="heldout", unique=True)
    (out / "heldout.jsonl").write_text("".join(json.dumps(r) + "\n" for r in held))
    if cfg.policy is not None:
        return
    torch.set_num_threads(cfg.ppo.threads or torch.get_num_threads())
    tok = build_tokenizer()
    lm = build_tiny_policy(tok, seed=d.seed, hidden_size=d.hidden_size, num_layers=d.num_layers)
    demos = sft_demonstrations(d.sft_demos, seed=d.seed, error_rate=d.sft_error_rate)
    held_demos = sft_demonstrations(max(d.sft_demos // 10, 1), seed=d.seed + 30_000, error_rate=d.sft_error_rate,
                                    split="heldout")
    train_sft(lm, tok, demos, SFTConfig(lr=d.sft_lr, max_steps=d.sft_steps, batch_size=d.sft_batch_size,
                                        log_every=10**9), output_dir=out / "sft", eval_rows=held_demos, seed=d.seed)


def run_one(run: TrainConfig, config_path: Path, log_path: Path) -> tuple[float, float]:
    """`ppo-lm train --config CONFIG` in a fresh process; returns its wall time (s, start-up included) and
    peak RSS (MB, from wait4: that process alone, not the ones before it)."""
    from ..trainer.config_io import dump_yaml

    dump_yaml(run, config_path)
    cmd = [sys.executable, "-m", "ppo_lm", "train", "--config", str(config_path)]
    t0 = time.perf_counter()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        try:
            _, status, usage = os.wait4(proc.pid, 0)
        except BaseException:  # Ctrl-C reaches the child too: let it stop, then stop here
            proc.wait()
            raise
        proc.returncode = os.waitstatus_to_exitcode(status)  # reaped by wait4; Popen must not wait again
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        lines = log_path.read_text(errors="replace").strip().splitlines()
        raise CompareError(f"the run in {run.output_dir} failed (status {proc.returncode}): "
                           f"{lines[-1] if lines else 'no output'}; its log is {log_path}")
    return wall, usage.ru_maxrss / 1024  # Linux: kilobytes


def _eval_source(cfg: CompareConfig) -> str:
    """The held-out prompts of the runs, in words: the demo's equations unless --config names others."""
    if cfg.ppo.data.eval_prompts is not None:
        return f"the prompts of {cfg.ppo.data.eval_prompts}"
    n = sum(1 for _ in open(Path(cfg.output_dir) / "heldout.jsonl"))
    return f"the demo's {n} held-out equations"


def run_compare(cfg: CompareConfig, argv: list[str] | None = None) -> dict:
    from ..reporting.compare_report import plot_curves, run_record, summarize, summary_markdown
    from ..trainer.config_io import to_dict

    check_compare(cfg)
    out = Path(cfg.output_dir)
    for name in OUTPUTS:
        p = out / name
        if p.is_dir():
            shutil.rmtree(p)
        elif p.exists():
            p.unlink()
    (out / "runs").mkdir()
    (out / "logs").mkdir()
    t0 = time.perf_counter()
    print(f"start: {cfg.policy or 'the demo SFT policy, building under ' + str(out / 'sft')}", flush=True)
    build_start(cfg, out)
    runs = []
    total = len(cfg.seeds) * len(cfg.estimators)
    # seed-major order: an interrupted comparison has every estimator for the seeds it finished, and a
    # host that slows down over time slows every estimator alike
    for seed in cfg.seeds:
        for est in cfg.estimators:
            run = run_config(cfg, est, seed)
            name = f"{est}-seed{seed}"
            print(f"[{len(runs) + 1}/{total}] {name} …", end=" ", flush=True)
            wall, rss = run_one(run, out / "runs" / f"{name}.yaml", out / "logs" / f"{name}.log")
            r = run_record(Path(run.output_dir) / "metrics.jsonl",
                           run.rollout.num_prompts * run.rollout.samples_per_prompt)
            r.update(estimator=est, seed=seed, wall_s=wall, peak_rss_mb=rss, models_held=models_held(run),
                     run_dir=run.output_dir)
            runs.append(r)
            print(f"held-out {r['accuracy_before']:.1%} → {r['accuracy_after']:.1%}, {wall:.0f} s, {rss:.0f} MB",
                  flush=True)
    p = cfg.ppo.rollout
    summary = {
        "command": "ppo-lm compare " + " ".join(argv) if argv is not None else None,
        "date": time.strftime("%Y-%m-%d"),
        "settings": {"estimators": cfg.estimators, "seeds": cfg.seeds, "iterations": cfg.iterations,
                     "num_prompts": p.num_prompts, "samples_per_prompt": p.samples_per_prompt,
                     "max_new_tokens": p.max_new_tokens, "policy": cfg.policy or "the demo's SFT policy (sft/)",
                     "eval_prompts": _eval_source(cfg), "threads": cfg.ppo.threads,
                     "cpus": os.cpu_count()},
        "estimators": summarize(runs),
        "runs": [{k: v for k, v in r.items() if k != "curves"} for r in runs],
        "wall_s": time.perf_counter() - t0,
        "config": to_dict(cfg),
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    (out / "summary.md").write_text(summary_markdown(summary))
    plot_curves(runs, out / "curves.png", title=f"{', '.join(cfg.estimators)}: mean over seeds "
                f"{','.join(map(str, cfg.seeds))}, band min–max")
    print(summary_markdown(summary), flush=True)
    print(f"outputs in {out}/ (summary.json, summary.md, curves.png, runs/)", flush=True)
    return summary


def cmd_compare(argv: list[str]) -> int:
    from .main import _run

    return _run(lambda: run_compare(parse_args(argv), argv))
