"""The start-up banner: the run in a few lines, read from its typed parts (trainer/assemble.py)."""

from __future__ import annotations

from typing import Protocol

import torch

from ..algorithms.off_policy import resolve_correction
from ..config.sizing import Resolved
from ..config.train import TrainConfig
from ..records.console import parameters
from ..rollout.sources.source import TrajectorySource
from ..tasks import reasoning_gym
from .assemble import Models, Sampler, Training


class Run(Protocol):
    """What the banner reads of a run (a :class:`~ppo_lm.trainer.ppo.PPOTrainer` is one)."""

    cfg: TrainConfig
    sized: Resolved
    device: torch.device
    models: Models
    sampler: Sampler
    training: Training
    source: TrajectorySource
    resuming: bool
    world: int


def _short(v: float | bool | str) -> str:
    """``3e-4`` rather than ``0.0003``; integers and words as they are; booleans as in YAML."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return v
    return f"{v:.0e}".replace("e-0", "e-") if isinstance(v, float) and 0 < abs(v) < 1e-2 else f"{v:g}"


def _correction(a) -> str:
    """The correction by its parts: 'tis (weight token-truncated, mask token-band, veto < 0.0001)'."""
    if a.off_policy_correction == "none":
        return "none"
    parts = resolve_correction(a.off_policy_correction, a.off_policy_mask)
    more = [f"weight {parts.weight}", *([f"mask {parts.mask}"] if parts.mask else []),
            *([f"veto < {a.is_veto:g}"] if a.is_veto is not None else [])]
    return f"{a.off_policy_correction} ({', '.join(more)})"


def _task_line(cfg: TrainConfig, prompts) -> str | None:
    """A reasoning-gym task's line: its settings, and how many problems each split holds."""
    task = reasoning_gym.task_of(cfg.data.prompts)
    if task is None:
        return None
    settings = " ".join(f"{k}={v}" for k, v in cfg.data.task_config.items()) or "its defaults"
    held = (f", {len(prompts.eval_rows)} held out (another seed; none of them trained on)"
            if prompts.eval_rows is not None and cfg.data.eval_prompts == cfg.data.prompts else "")
    return (f"  prompts   reasoning-gym {task} ({settings}): {len(prompts.rows)} problems (seed {cfg.seed}){held}; "
            f"answers taken by `data.task_answer` {cfg.data.task_answer}")


def banner(run: Run) -> str:
    """The run in a few lines: version, output, device and dtype, each model's size, the settings
    resolved for that size, the estimator and the per-iteration budget."""
    from .. import __version__


    cfg, a, r, o = run.cfg, run.cfg.algo, run.cfg.rollout, run.cfg.optim
    lines = [f"ppo-lm {__version__} · {'resuming' if run.resuming else 'new run'} in {cfg.output_dir}"
             + (f" · {run.world} processes" if run.world > 1 else "")]
    lines.append(f"  device {run.device} · {cfg.model.dtype}"
                 + (f" · {run.training.learner.lanes.lanes} CPU lanes" if run.device.type == "cpu" and run.world == 1 else ""))
    lines.append(f"  policy    {type(run.models.policy.lm).__name__} from {cfg.model.policy}: "
                 f"{parameters(run.models.policy)}")
    if run.models.ref.base_only:
        m = cfg.model
        lines.append(f"  LoRA      r {m.lora_r} · alpha {m.lora_alpha:g} · dropout {m.lora_dropout:g} · "
                     f"on {','.join(m.lora_target_modules)}")
        lines.append("  reference the policy with its adapters off (no copy of the weights)")
    else:
        lines.append(f"  reference frozen copy of the policy: {parameters(run.models.ref)}")
    kind = run.models.critic_kind
    body = f"{type(run.models.critic.model).__name__}: {parameters(run.models.critic)}" if run.models.critic is not None else ""
    if line := kind.banner(cfg, body):
        lines.append(line)
    envs = run.sampler.producer.envs
    if envs is not None:
        e = run.sampler.producer.episodes
        lines.append(f"  env       {cfg.rollout.env}: ≤ {e.max_turns} turns, ≤ {e.max_episode_tokens} tokens per episode "
                     f"(its turn rewards are the reward); {envs.size} worker process"
                     f"{'es' if envs.size > 1 else ''}, each call ≤ {envs.timeout_s:g} s"
                     + (f"; {e.max_live} episodes at once" if e.max_live else ""))
    agents = run.sampler.producer.agents
    if agents is not None:
        lines.append(f"  agent     {cfg.rollout.agent}: run(client, row) per episode, its return the reward; the policy "
                     f"served on 127.0.0.1 (OpenAI API), ≤ {agents.endpoint.max_context} tokens per call, each episode "
                     f"≤ {agents.timeout_s:g} s")
    if (line := _task_line(cfg, run.sampler.prompts)) is not None:
        lines.append(line)
    for term in run.models.rewards:
        weight = f" × {term.weight:g}" if len(run.models.rewards) > 1 else ""
        what = f"model: {parameters(term.model)}" if term.model is not None else "verifier"
        lines.append(f"  reward    {term.name}{weight} ({what})")
    if r.max_staleness:
        threads = run.source.producer_threads
        lines.append(f"  async     a producer process samples up to {r.max_staleness} update"
                     f"{'s' if r.max_staleness > 1 else ''} behind the learner ({threads} torch thread"
                     f"{'s' if threads != 1 else ''}) · correction {_correction(a)} (docs/async.md)")
    if run.sized.values:
        values = " · ".join(f"{k} {_short(v)}" for k, v in run.sized.values.items())
        lines.append(f"  auto      {values} ({run.sized.reason}; config/sizing.py)")
    kl = f"KL {a.kl_estimator} in the {a.kl_in}, β {a.kl_coef:g}" if a.kl_coef else "no KL"
    lines.append(f"  estimator {a.estimator} · {kl} · {r.num_prompts} prompts × {r.samples_per_prompt} "
                 f"sample{'s' if r.samples_per_prompt > 1 else ''} × ≤{r.max_new_tokens} tokens per iteration · {o.epochs} epochs × "
                 f"{o.num_minibatches} minibatches · {cfg.iterations} iterations")
    return "\n".join(lines)
