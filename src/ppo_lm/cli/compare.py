"""`ppo-lm compare`: advantage estimators side by side on one task, from one start, at an equal budget
of sampled episodes per iteration, with the same seeds.

By default each estimator runs in the layout it is meant for (one sample of more prompts for GAE and
REINFORCE++, groups for GRPO, Dr. GRPO and RLOO); ``--layout common`` gives every estimator the groups.
The task is the built-in equation task from the demo's SFT policy, or your own (``--policy``,
``--prompts``, ``--reward``, ``--eval-prompts``). Every run is a fresh ``ppo-lm train`` process, started
one after another, so its wall time and peak RSS are its own (docs/compare.md). How each run's
settings are layered: cli/compare_plan.py.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..config.train import TrainConfig
from ..runtime.errors import ArgumentParser
from ..tasks import reasoning_gym
from .compare_plan import (
    LAYOUTS,
    CompareError,
    base_settings,
    build_start,
    critic_of,
    estimator_of,
    models_held,
    read_file_settings,
    run_one,
    run_settings,
)

__all__ = ["CompareConfig", "CompareError", "check_compare", "cmd_compare", "parse_args", "run_compare",
           "run_config", "run_one"]


@dataclass
class CompareConfig:
    estimators: list[str] = field(default_factory=lambda: ["gae", "grpo", "rloo", "reinforce++"])
    """Advantage estimators (`algo.estimator` names), or variants the --config file's `per_estimator`
    defines (a section that sets `algo.estimator`), each run with every seed."""
    iterations: int = 400
    """PPO iterations of every run (replaces the --config file's `iterations`)."""
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])
    """Seeds of the runs (`seed` of `ppo-lm train`: prompt order, sampling, shuffling)."""
    layout: str = "natural"
    """'natural': each estimator in its own layout of the episodes (cli/compare_plan.py:layout);
    'common': groups of group_size for every estimator."""
    episodes: int = 128
    """Episodes sampled per iteration by every run (prompts × samples per prompt)."""
    group_size: int = 4
    """Samples per prompt of the group estimators (of every estimator with layout 'common')."""
    config: str | None = None
    """A `ppo-lm train` YAML file merged over every run's settings, with optional `per_estimator` sections."""
    policy: str | None = None
    """The start of every run (anything `model.policy` takes); None = the demo's SFT policy on the
    built-in task, built under OUTPUT_DIR/sft."""
    prompts: str | None = None
    """Training prompts of your own task (`data.prompts`): a file, or 'reasoning-gym:TASK' (scored by the
    task's own scorer, held out from another seed unless --eval-prompts says otherwise); None = the
    built-in task (or the file's)."""
    reward: str | None = None
    """The reward of your own task (`model.reward`); none with an environment, whose turn rewards are the
    reward."""
    eval_prompts: str | None = None
    """Held-out prompts of your own task (`data.eval_prompts`), scored by the reward's verifier."""
    env: str | None = None
    """A multi-turn environment for every run (`rollout.env`, docs/environments.md), e.g.
    builtin:equations_retry; held-out episodes are then scored by their mean return."""
    output_dir: str = "compare"
    """Where summary.json, summary.md, curves.png, sft/ and runs/ go."""
    overwrite: bool = False
    """Replace the outputs of an earlier comparison in output_dir (otherwise an error)."""
    resume: bool = False
    """Continue the comparison in output_dir: keep each run that finished with the settings it would
    have now, run the others (cli/compare_resume.py)."""
    smoke: bool = False
    """Tiny sizes that run in seconds (wiring check, used by the tests): at most 2 iterations of 8
    episodes, 4-token responses, one epoch of one minibatch and 8 held-out prompts, over the --config
    file's settings as well."""
    file_settings: dict = field(default_factory=dict)
    """The --config file's settings for every run (read by check_compare)."""
    per_estimator: dict[str, dict] = field(default_factory=dict)
    """The --config file's per_estimator sections."""

    @property
    def own_task(self) -> bool:
        return self.prompts is not None or bool((self.file_settings.get("data") or {}).get("prompts"))

    @property
    def environment(self) -> str | None:
        """The runs' environment: --env, or the --config file's `rollout.env`."""
        return self.env or (self.file_settings.get("rollout") or {}).get("env")


SMOKE_ITERATIONS = 2
SMOKE_EVAL_PROMPTS = 8
OUTPUTS = ("summary.json", "summary.md", "curves.png", "heldout.jsonl", "sft", "runs", "logs")


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
                       "budget of sampled episodes and seeds; writes summary.json, summary.md and curves.png.")
    p.add_argument("--estimators", type=_csv(str, "comma-separated list"), default=d.estimators,
                   help=f"comma-separated, e.g. {','.join(d.estimators)} (the default); a variant of the "
                        "--config file's per_estimator (a section that sets algo.estimator) counts as one")
    p.add_argument("--iterations", type=int, default=d.iterations, help=f"iterations of every run ({d.iterations})")
    p.add_argument("--seeds", type=_csv(int, "comma-separated list of distinct integers"), default=d.seeds,
                   help=f"comma-separated, e.g. {','.join(map(str, d.seeds))} (the default)")
    p.add_argument("--layout", choices=LAYOUTS, default=d.layout,
                   help="natural (the default): one sample of more prompts for gae and reinforce++, groups for "
                        "grpo, dr_grpo, rloo; common: groups for every estimator")
    p.add_argument("--episodes", type=int, default=d.episodes, help=f"episodes per iteration of every run ({d.episodes})")
    p.add_argument("--group-size", "--group_size", type=int, default=d.group_size,
                   help=f"samples per prompt of a group ({d.group_size})")
    p.add_argument("--config", default=None, help="a `ppo-lm train` YAML file merged over every run's settings; "
                   "a `per_estimator: {NAME: {...}}` section applies to that estimator's runs only")
    p.add_argument("--policy", default=None, help="start of every run: a model directory or .gguf file (default: "
                   "the demo's SFT policy, built once)")
    p.add_argument("--prompts", default=None, help="training prompts of your own task (as `data.prompts`)")
    p.add_argument("--reward", default=None, help="reward of your own task (as `model.reward`; not with --env, "
                   "whose turn rewards are the reward)")
    p.add_argument("--eval-prompts", "--eval_prompts", default=None,
                   help="held-out prompts of your own task (as `data.eval_prompts`)")
    p.add_argument("--env", default=None, help="a multi-turn environment for every run (as `rollout.env`), e.g. "
                   "builtin:equations_retry")
    p.add_argument("--output-dir", "--output_dir", default=d.output_dir, help=f"default {d.output_dir}/")
    p.add_argument("--overwrite", action="store_true",
                   help="replace an earlier comparison's outputs in --output-dir")
    p.add_argument("--resume", action="store_true",
                   help="continue the comparison in --output-dir: runs that finished with the same settings are "
                        "kept, the others (unfinished, new seeds or estimators) run")
    p.add_argument("--smoke", action="store_true",
                   help="tiny sizes that run in seconds (wiring check): at most "
                   f"{SMOKE_ITERATIONS} iterations of 8 episodes, 4-token responses, {SMOKE_EVAL_PROMPTS} held-out prompts")
    a = p.parse_args(argv)
    cfg = CompareConfig(**{k: v for k, v in vars(a).items()})
    if cfg.smoke:
        cfg.episodes, cfg.group_size, cfg.iterations = 8, 2, min(cfg.iterations, SMOKE_ITERATIONS)
    return cfg


def _check_names(cfg: CompareConfig) -> None:
    """Each name of --estimators is an estimator, or a variant the --config file's ``per_estimator``
    defines (a section that sets ``algo.estimator``)."""
    from ..algorithms.registry import ADVANTAGE_ESTIMATORS

    unknown = [e for e in cfg.estimators if e not in ADVANTAGE_ESTIMATORS and e not in cfg.per_estimator]
    if unknown:
        raise CompareError(f"--estimators: unknown estimator(s) {', '.join(map(repr, unknown))}; choose from "
                           f"{', '.join(ADVANTAGE_ESTIMATORS)}, or define a variant in the --config file's "
                           "`per_estimator` (a section that sets `algo.estimator`)")


def _check_numbers(cfg: CompareConfig) -> None:
    for name, value, least in (("iterations", cfg.iterations, 1), ("episodes", cfg.episodes, 1),
                               ("group-size", cfg.group_size, 2)):
        if value < least:
            raise CompareError(f"--{name} must be >= {least}, got {value}")
    if cfg.episodes % cfg.group_size:
        raise CompareError(f"--episodes {cfg.episodes} is not a multiple of --group-size {cfg.group_size}: the group "
                           "estimators sample episodes / group-size prompts; choose sizes that divide")
    if any(s < 0 for s in cfg.seeds):
        raise CompareError(f"--seeds must be >= 0, got {','.join(map(str, cfg.seeds))}")


def _check_task(cfg: CompareConfig) -> None:
    """A task of your own names its start, reward and held-out prompts (flags or the file); with an
    environment its turn rewards are the reward, so a --reward would go unused."""
    env = cfg.environment
    if env and cfg.reward is not None:
        raise CompareError(f"--reward: with --env the environment's turn rewards are the reward ({env}; "
                           "`model.reward` is not used); leave --reward out")
    if not cfg.own_task:
        return
    fm, fd = cfg.file_settings.get("model") or {}, cfg.file_settings.get("data") or {}
    task = reasoning_gym.task_of(cfg.prompts or fd.get("prompts"))  # its own scorer and held-out problems
    needs = [("--policy", cfg.policy or fm.get("policy"), "the model to start every run from"),
             # an environment is its own reward
             ("--reward", cfg.reward or fm.get("reward") or env or task, "its verifier, e.g. rewards.py:correct"),
             ("--eval-prompts", cfg.eval_prompts or fd.get("eval_prompts") or task,
              "held-out prompts to measure every run on")]
    for flag, value, fix in needs:
        if not value:
            raise CompareError(f"--prompts: a task of your own needs {flag} ({fix}), or the --config file's setting")


def check_compare(cfg: CompareConfig) -> None:
    """Everything that needs no model, before the first run: a mistake costs a second, not a run. With a
    start that exists already, each estimator's first run passes the trainer's own checks
    (preflight: paths, reward import, prompt files)."""
    from ..runtime.errors import ConfigError
    from ..runtime.files import prepare_output_dir

    _check_numbers(cfg)
    if cfg.resume and cfg.overwrite:
        raise CompareError("--resume keeps an earlier comparison's finished runs and --overwrite deletes them; "
                           "pass one of the two")
    if cfg.config:
        try:
            cfg.file_settings, cfg.per_estimator = read_file_settings(cfg.config)
        except ConfigError as e:
            raise CompareError(str(e)) from None
    _check_names(cfg)
    _check_task(cfg)
    for est in cfg.estimators:
        try:
            _check_run(run_config(cfg, est, cfg.seeds[0]), start_exists=cfg.policy is not None or cfg.own_task,
                       held_out_built_later=not cfg.own_task, smoke=cfg.smoke)
        except ConfigError as e:
            raise CompareError(f"estimator {est!r}: {e}") from None
    out = Path(cfg.output_dir)
    try:
        prepare_output_dir(out, "output_dir")
    except ValueError as e:
        raise CompareError(str(e)) from None
    found = [name for name in OUTPUTS if (out / name).exists()]
    if found and not (cfg.overwrite or cfg.resume):
        raise CompareError(f"`output_dir` {str(out)!r} already holds a comparison ({', '.join(found)}); pass "
                           "--resume to continue it, --overwrite to replace it, or choose another --output-dir")


def _check_run(run: TrainConfig, start_exists: bool, held_out_built_later: bool, smoke: bool) -> None:
    from ..config.validate import validate_config
    from ..trainer.preflight import preflight

    if not start_exists:  # the demo's SFT policy is built later: the settings alone
        validate_config(run, 1)
        return
    with tempfile.TemporaryDirectory() as tmp:
        if held_out_built_later:  # the built-in task's held-out file, written by the comparison after its checks
            build_start(Path(tmp), smoke=smoke, build_policy=False, threads=0)
            run.data.eval_prompts = str(Path(tmp) / "heldout.jsonl")
        run.output_dir = str(Path(tmp) / "run")
        preflight(run)


def run_config(cfg: CompareConfig, estimator: str, seed: int) -> TrainConfig:
    """The settings of one run: layers 1–4 of cli/compare_plan.py, then what the comparison sets."""
    out = Path(cfg.output_dir)
    base = base_settings(cfg.own_task, cfg.iterations)
    run = run_settings(base, estimator, layout_name=cfg.layout, episodes=cfg.episodes, group_size=cfg.group_size,
                       file_settings=cfg.file_settings, per_estimator=cfg.per_estimator)
    if cfg.smoke:  # over the --config file's sizes too: a wiring check of a real model's settings stays short
        run.rollout.max_new_tokens, run.optim.epochs, run.optim.num_minibatches = 4, 1, 1
        run.data.eval_max_prompts, run.log.eval_every = SMOKE_EVAL_PROMPTS, 1
    run.algo.estimator = estimator_of(estimator, cfg.per_estimator)  # type: ignore[assignment]  # checked
    run.seed = seed
    run.iterations = cfg.iterations
    run.output_dir = str(out / "runs" / f"{estimator}-seed{seed}")
    if cfg.policy is not None:
        run.model.policy = cfg.policy
    elif not cfg.own_task:
        run.model.policy = run.model.tokenizer = str(out / "sft")
    for value, section, name in ((cfg.prompts, run.data, "prompts"), (cfg.reward, run.model, "reward"),
                                 (cfg.eval_prompts, run.data, "eval_prompts"), (cfg.env, run.rollout, "env")):
        if value is not None:
            setattr(section, name, value)
    if run.data.eval_prompts is None and reasoning_gym.task_of(run.data.prompts) is not None:
        run.data.eval_prompts = run.data.prompts  # the task's held-out problems, from a seed of their own
    if cfg.smoke:
        _smoke_sizes(run.data)
    if run.data.eval_prompts is None and not cfg.own_task:
        run.data.eval_prompts = str(out / "heldout.jsonl")
    return run


def _smoke_sizes(data) -> None:
    """The generated prompts' sizes of a wiring check: the built-in task's, a reasoning-gym task's
    (prompts of your own have theirs)."""
    if data.prompts == "builtin:equations":
        data.builtin_num_prompts = 32
    if data.eval_prompts == "builtin:equations":
        data.builtin_eval_prompts = SMOKE_EVAL_PROMPTS
    if reasoning_gym.task_of(data.prompts) is not None:
        data.task_size = 32
    if reasoning_gym.task_of(data.eval_prompts) is not None:
        data.task_eval_size = SMOKE_EVAL_PROMPTS


def _eval_source(cfg: CompareConfig, run: TrainConfig) -> str:
    """The held-out prompts of the runs, in words."""
    if run.data.eval_prompts != str(Path(cfg.output_dir) / "heldout.jsonl"):
        return f"the prompts of {run.data.eval_prompts}"
    n = sum(1 for _ in open(run.data.eval_prompts))
    first = run.data.eval_max_prompts
    return f"the first {first} of the demo's {n} held-out equations" if 0 < first < n else f"the demo's {n} held-out equations"


def _settings(cfg: CompareConfig, runs: dict[str, TrainConfig]) -> dict:
    first = next(iter(runs.values()))
    return {"estimators": cfg.estimators, "seeds": cfg.seeds, "iterations": cfg.iterations, "layout": cfg.layout,
            "episodes": cfg.episodes, "group_size": cfg.group_size,
            "layouts": {e: [r.rollout.num_prompts, r.rollout.samples_per_prompt] for e, r in runs.items()},
            "max_new_tokens": first.rollout.max_new_tokens,  # "auto": each run resolves it from its policy
            "policy": cfg.policy or ("the demo's SFT policy (sft/)" if not cfg.own_task else first.model.policy),
            "eval_prompts": _eval_source(cfg, first), "threads": first.threads, "cpus": os.cpu_count(),
            "env": first.rollout.env, "eval_samples": first.log.eval_samples}


def _prepare_output(cfg: CompareConfig, out: Path) -> None:
    """An empty comparison in ``out``; with --resume the earlier one's start, runs and logs stay."""
    from .compare_resume import KEEP, start_built

    for name in OUTPUTS:
        p = out / name
        if cfg.resume and name in KEEP:
            continue
        if p.is_dir():
            shutil.rmtree(p)
        elif p.exists():
            p.unlink()
    (out / "runs").mkdir(exist_ok=True)
    (out / "logs").mkdir(exist_ok=True)
    if cfg.own_task:
        return
    if cfg.resume and start_built(out, build_policy=cfg.policy is None):
        print(f"start: kept from the earlier comparison ({out / 'heldout.jsonl'}"
              f"{', ' + str(out / 'sft') if cfg.policy is None else ''})", flush=True)
        return
    print(f"start: {cfg.policy or 'the demo SFT policy, building under ' + str(out / 'sft')}", flush=True)
    threads = run_config(cfg, cfg.estimators[0], cfg.seeds[0]).threads  # the runs' own (a --config may set it)
    build_start(out, smoke=cfg.smoke, build_policy=cfg.policy is None, threads=threads)


def _run_all(cfg: CompareConfig, out: Path) -> tuple[list[dict], list[str]]:
    """Every run of the plan in seed-major order (an interrupted comparison has every estimator for the
    seeds it finished, and a host that slows down over time slows every estimator alike), each a fresh
    process, its record saved as it ends; with --resume a run that finished with the same settings is
    read back instead. Returns the records and the names of the runs kept."""
    from ..reporting.compare_report import held_out_value, run_record
    from .compare_resume import clear_run, cpu_model, finished, save_record

    runs, kept = [], []
    total = len(cfg.seeds) * len(cfg.estimators)
    for seed in cfg.seeds:
        for est in cfg.estimators:
            run = run_config(cfg, est, seed)
            name = f"{est}-seed{seed}"
            print(f"[{len(runs) + 1}/{total}] {name} ({run.rollout.num_prompts} × {run.rollout.samples_per_prompt}) …",
                  end=" ", flush=True)
            r, why = finished(out, name, run) if cfg.resume else (None, "new")
            if r is not None:
                kept.append(name)
            else:
                if why != "new":
                    print(f"({why}) …", end=" ", flush=True)
                clear_run(out, name)
                wall, rss = run_one(run, out / "runs" / f"{name}.yaml", out / "logs" / f"{name}.log")
                r = run_record(Path(run.output_dir) / "metrics.jsonl",
                               run.rollout.num_prompts * run.rollout.samples_per_prompt)
                r.update(estimator=est, seed=seed, wall_s=wall, peak_rss_mb=rss,
                         models_held=models_held(run, critic_of(run)), run_dir=run.output_dir, cpu=cpu_model())
                save_record(out, name, r)
            runs.append(r)
            env = run.rollout.env
            print(f"held-out {'mean return ' if env else ''}{held_out_value(r['accuracy_before'], env)} → "
                  f"{held_out_value(r['accuracy_after'], env)}, {r['wall_s']:.0f} s, {r['peak_rss_mb']:.0f} MB"
                  f"{' (finished earlier, kept)' if name in kept else ''}", flush=True)
    return runs, kept


def run_compare(cfg: CompareConfig, argv: list[str] | None = None) -> dict:
    from ..reporting.compare_report import equal_budgets, plot_curves, summarize, summary_markdown

    check_compare(cfg)
    out = Path(cfg.output_dir)
    t0 = time.perf_counter()
    _prepare_output(cfg, out)
    runs, kept = _run_all(cfg, out)
    summary = {
        "command": "ppo-lm compare " + " ".join(argv) if argv is not None else None,
        "date": time.strftime("%Y-%m-%d"),
        "settings": _settings(cfg, {e: run_config(cfg, e, cfg.seeds[0]) for e in cfg.estimators}),
        "estimators": summarize(runs),
        "equal_budgets": equal_budgets(runs),
        "runs": [{k: v for k, v in r.items() if k not in ("curves", "wall_curves")} for r in runs],
        "wall_s": time.perf_counter() - t0,
        "kept": kept,
        "per_estimator": cfg.per_estimator,
        "file_settings": cfg.file_settings,
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    (out / "summary.md").write_text(summary_markdown(summary))
    plot_curves(runs, out / "curves.png", title=f"{', '.join(cfg.estimators)} ({cfg.layout} layout): mean over "
                f"seeds {','.join(map(str, cfg.seeds))}, band min–max", env=summary["settings"]["env"])
    print(summary_markdown(summary), flush=True)
    print(f"outputs in {out}/ (summary.json, summary.md, curves.png, runs/)", flush=True)
    return summary


def cmd_compare(argv: list[str]) -> int:
    from .main import _run

    return _run(lambda: run_compare(parse_args(argv), argv))
