"""What a run prints for people and for batch jobs' logs: progress while models load, a start-up
banner, and (records/metrics_log.py) a line per iteration. Only the main process prints; every line is
flushed, so ``ppo-lm train … > log 2>&1`` shows the run as it goes."""

from __future__ import annotations

import contextlib
import time

from torch import nn

from ..algorithms.off_policy import resolve_correction
from ..runtime import distributed as dist


def say(message: str) -> None:
    if dist.is_main():
        print(message, flush=True)


@contextlib.contextmanager
def loading(what: str, source: str):
    """``loading the policy from DIR …`` then ``loaded the policy in 12.3 s``: a big model takes
    minutes to load, and a silent process looks hung. Two whole lines, as libraries may draw their own
    progress bars in between."""
    t0 = time.perf_counter()
    say(f"loading {what} from {source} …")
    yield
    say(f"loaded {what} in {time.perf_counter() - t0:.1f} s")


def parameters(model: nn.Module | None) -> str:
    """``'1.23 M (trained)'``-style count of a model's parameters."""
    if model is None:
        return "none"
    total = sum(p.numel() for p in model.parameters())
    trained = sum(p.numel() for p in model.parameters() if p.requires_grad)
    size = f"{total / 1e9:.2f} B" if total >= 1e9 else f"{total / 1e6:.2f} M"
    state = "trained" if trained == total else "frozen" if trained == 0 else f"{trained / total:.0%} trained"
    return f"{size} parameters, {state}"


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


def banner(trainer) -> str:
    """The run in a few lines: version, output, device and dtype, each model's size, the settings
    resolved for that size, the estimator and the per-iteration budget."""
    from .. import __version__

    cfg, a, r, o = trainer.cfg, trainer.cfg.algo, trainer.cfg.rollout, trainer.cfg.optim
    lines = [f"ppo-lm {__version__} · {'resuming' if trainer.resuming else 'new run'} in {cfg.output_dir}"
             + (f" · {trainer.world} processes" if trainer.world > 1 else "")]
    lines.append(f"  device {trainer.device} · {cfg.model.dtype}"
                 + (f" · {trainer.learner.lanes.lanes} CPU lanes" if trainer.device.type == "cpu" and trainer.world == 1 else ""))
    lines.append(f"  policy    {type(trainer.policy.lm).__name__} from {cfg.model.policy}: "
                 f"{parameters(trainer.policy)}")
    if trainer.ref.base_only:
        m = cfg.model
        lines.append(f"  LoRA      r {m.lora_r} · alpha {m.lora_alpha:g} · dropout {m.lora_dropout:g} · "
                     f"on {','.join(m.lora_target_modules)}")
        lines.append("  reference the policy with its adapters off (no copy of the weights)")
    else:
        lines.append(f"  reference frozen copy of the policy: {parameters(trainer.ref)}")
    m = cfg.model
    kind = trainer.models.critic_kind
    body = f"{type(trainer.critic.model).__name__}: {parameters(trainer.critic)}" if trainer.critic is not None else ""
    if line := kind.banner(m, body):
        lines.append(line)
    envs = trainer.producer.envs
    if envs is not None:
        e = trainer.producer.episodes
        lines.append(f"  env       {cfg.rollout.env}: ≤ {e.max_turns} turns, ≤ {e.max_episode_tokens} tokens per episode "
                     f"(its turn rewards are the reward); {envs.size} worker process"
                     f"{'es' if envs.size > 1 else ''}, each call ≤ {envs.timeout_s:g} s")
    for term in trainer.rewards:
        weight = f" × {term.weight:g}" if len(trainer.rewards) > 1 else ""
        what = f"model: {parameters(term.model)}" if term.model is not None else "verifier"
        lines.append(f"  reward    {term.name}{weight} ({what})")
    if r.max_staleness:
        threads = trainer.source.threads  # an AsyncSource wherever max_staleness ≥ 1
        lines.append(f"  async     a producer process samples up to {r.max_staleness} update"
                     f"{'s' if r.max_staleness > 1 else ''} behind the learner ({threads} torch thread"
                     f"{'s' if threads != 1 else ''}) · correction {_correction(a)} (docs/async.md)")
    if trainer.sized.values:
        values = " · ".join(f"{k} {_short(v)}" for k, v in trainer.sized.values.items())
        lines.append(f"  auto      {values} ({trainer.sized.reason}; config/sizing.py)")
    kl = f"KL {a.kl_estimator} in the {a.kl_in}, β {a.kl_coef:g}" if a.kl_coef else "no KL"
    lines.append(f"  estimator {a.estimator} · {kl} · {r.num_prompts} prompts × {r.samples_per_prompt} "
                 f"sample{'s' if r.samples_per_prompt > 1 else ''} × ≤{r.max_new_tokens} tokens per iteration · {o.epochs} epochs × "
                 f"{o.num_minibatches} minibatches · {cfg.iterations} iterations")
    return "\n".join(lines)
