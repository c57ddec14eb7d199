"""The runs of `ppo-lm compare`: what each estimator's run is set to, and the start they share.

A run's settings are built in layers, each over the one before (docs/compare.md):

1. the base: the demo's PPO stage (src/ppo_lm/presets/demo_ppo.yaml) on the built-in task, or the
   ``ppo-lm train`` defaults on a task of your own (``--prompts`` / ``data.prompts``), with the
   comparison's logging (an evaluation every 1/16 of the run, one checkpoint at its end, no trackers);
2. the layout of the episodes of an iteration (:func:`layout`): ``--episodes`` per iteration for every
   estimator, as one sample of each of that many prompts for an estimator without groups (gae,
   reinforce++), and as groups of ``--group-size`` samples for the group estimators (grpo, dr_grpo,
   rloo) — or, with ``--layout common``, groups for every estimator;
3. the ``--config`` file's settings, for every run;
4. the file's ``per_estimator: {NAME: {...}}`` section for that estimator;
5. what the comparison itself sets: the estimator, seed, iterations, output directory, the start, and
   the task flags (``--prompts``, ``--reward``, ``--eval-prompts``).

A ``per_estimator`` section may also name a *variant*: a name of your own whose section sets
``algo.estimator`` (``gae-lora: {algo: {estimator: gae}, critic: {lora_r: 16}}``), listed in
``--estimators`` like an estimator and run in its estimator's layout — one comparison of several
settings of one estimator, alternated seed by seed like any other.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from ..config.train import TrainConfig
from ..runtime.errors import UserError
from ..trainer.seeds import builtin_held_out_seed

LAYOUTS = ("natural", "common")


class CompareError(UserError):
    """A bad setting of `ppo-lm compare`, or a run of it that failed."""


def base_settings(own_task: bool, iterations: int) -> TrainConfig:
    """Layer 1: the demo's PPO stage on the built-in task (2 threads, as its tables were measured), or
    the train defaults on your own; the comparison's logging either way."""
    if own_task:
        cfg = TrainConfig()
    else:
        from .demo import demo_ppo

        cfg = demo_ppo()
        cfg.threads = 2
    cfg.log.eval_every = max(iterations // 16, 1)
    cfg.log.save_every = 0  # one checkpoint at the end: the comparison never resumes
    cfg.log.report_to = []  # metrics.jsonl is the record; tracker files would only cost time
    cfg.log.progress = False  # metrics.jsonl is read afterwards; the terminal shows one line per run
    return cfg


def layout(estimator: str, name: str, episodes: int, group_size: int) -> tuple[int, int]:
    """Layer 2: (prompts, samples per prompt) of an iteration of ``episodes`` episodes. ``natural``: the
    layout an estimator is meant for — groups of ``group_size`` for those that compare samples of a
    prompt, one sample of ``episodes`` prompts for the others (a critic, or REINFORCE++'s batch
    baseline, has no use for repeats); ``common``: groups for every estimator."""
    from ..algorithms.registry import get_advantage_estimator

    if name == "natural" and not get_advantage_estimator(estimator).needs_groups:
        return episodes, 1
    return episodes // group_size, group_size


def estimator_of(name: str, per_estimator: dict[str, dict]) -> str:
    """The advantage estimator a name of ``--estimators`` runs: the name itself, or a variant's
    ``algo.estimator`` (its ``per_estimator`` section)."""
    return ((per_estimator.get(name) or {}).get("algo") or {}).get("estimator") or name


def run_settings(base: TrainConfig, estimator: str, *, layout_name: str, episodes: int, group_size: int,
                 file_settings: dict, per_estimator: dict[str, dict]) -> TrainConfig:
    """Layers 1–4 for one estimator or variant (the comparison's own fields come on top, in
    compare.run_config)."""
    from ..config.io import from_dict

    run = copy.deepcopy(base)
    run.rollout.num_prompts, run.rollout.samples_per_prompt = layout(estimator_of(estimator, per_estimator),
                                                                     layout_name, episodes, group_size)
    run = from_dict(TrainConfig, copy.deepcopy(file_settings), base=run)
    section = per_estimator.get(estimator)
    if section:
        run = from_dict(TrainConfig, copy.deepcopy(section), base=run, prefix=f"per_estimator.{estimator}")
    return run


def read_file_settings(path: str) -> tuple[dict, dict[str, dict]]:
    """The ``--config`` file: its settings for every run, and its ``per_estimator`` sections, each
    checked field by field (unknown fields and wrong types are one line naming them)."""
    from ..algorithms.registry import ADVANTAGE_ESTIMATORS
    from ..config.io import from_dict, read_yaml
    from ..runtime.errors import ConfigError

    data = read_yaml(path)
    sections = data.pop("per_estimator", None) or {}
    try:
        if not isinstance(sections, dict):
            raise ConfigError(f"`per_estimator` must map estimator names to settings, got {sections!r}")
        from_dict(TrainConfig, copy.deepcopy(data))
        for name, section in sections.items():
            from_dict(TrainConfig, copy.deepcopy(section), prefix=f"per_estimator.{name}")
            runs = estimator_of(name, sections)
            if name not in ADVANTAGE_ESTIMATORS and runs == name:
                raise ConfigError(f"`per_estimator.{name}`: unknown estimator; choose from "
                                  f"{', '.join(ADVANTAGE_ESTIMATORS)}, or make it a variant by setting "
                                  "`algo.estimator` in it")
            if name in ADVANTAGE_ESTIMATORS and runs != name:
                raise ConfigError(f"`per_estimator.{name}.algo.estimator`={runs!r}: the section of estimator "
                                  f"{name!r} cannot run another; name a variant instead (e.g. {runs}-{name})")
    except ConfigError as e:
        raise CompareError(f"{path}: {e}") from None
    return data, {name: section or {} for name, section in sections.items()}


def models_held(run: TrainConfig, critic: str | None = None) -> list[str]:
    """The models a run holds in memory: the policy, its frozen reference (not a second copy with LoRA:
    the policy with its adapters off), a critic for estimators that need one (a separate model, its
    adapters or its value head on a frozen body, or a value head on the policy), and each reward model
    of `model.reward`. ``critic``: the kind an ``auto`` ``critic.kind`` resolved to in the run."""
    import dataclasses

    from ..algorithms.registry import get_advantage_estimator
    from ..config.specs import is_model_path, reward_specs

    held = ["policy"] if getattr(run.model, "lora_r", 0) else ["policy", "reference"]
    if get_advantage_estimator(run.algo.estimator).needs_critic:
        held.append(_critic_held(run if critic is None else dataclasses.replace(run, critic=dataclasses.replace(run.critic, kind=critic))))
    held += ["reward model" for spec, _ in reward_specs(run) if is_model_path(spec)]
    return held


def critic_of(run: TrainConfig) -> str | None:
    """The kind an ``auto`` ``critic.kind`` resolved to in a finished run, read from its last checkpoint
    (what each kind ``auto`` may pick saves: config/critics.py); None where the run named it."""
    from ..config import critics
    from ..trainer.checkpoint.folders import latest_checkpoint

    if run.critic.kind != "auto":
        return None
    found = latest_checkpoint(run.output_dir)
    if found is None:
        return None
    return next((k.name for k in (critics.AUTO_SMALL, critics.AUTO_LARGE, critics.AUTO_ENV)
                 if (found[1] / k.checkpoint).exists()), None)


def _critic_held(run: TrainConfig) -> str:
    """How :func:`models_held` names a run's critic."""
    from ..config import critics

    if run.critic.kind == "auto":  # the run's kind could not be read back
        return "critic (auto)"
    return critics.CriticKind.REGISTRY[run.critic.kind].held(run)


def build_start(out: Path, *, smoke: bool, build_policy: bool, threads: int) -> None:
    """The built-in task's start: the demo's held-out equations (seed 0) in OUT/heldout.jsonl and, with
    ``build_policy``, the demo's SFT policy (its seed 0 and settings) under OUT/sft — one start and one
    evaluation set for every run."""
    import torch

    from ..stages.sft import SFTConfig, train_sft
    from ..tasks.equations import build_tiny_policy, build_tokenizer, make_prompts, sft_demonstrations
    from .demo import DemoConfig

    d = DemoConfig()
    if smoke:
        d.shrink()
    held = make_prompts(d.eval_prompts, seed=builtin_held_out_seed(d.seed), split="heldout", unique=True)
    (out / "heldout.jsonl").write_text("".join(json.dumps(r) + "\n" for r in held))
    if not build_policy:
        return
    torch.set_num_threads(threads or torch.get_num_threads())
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
    from ..config.io import dump_yaml

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
