"""`ppo-lm demo`: the whole RLHF pipeline on the built-in equation task, offline on a laptop CPU.

SFT on imperfect demonstrations → (optionally) a reward model from policy samples → PPO with GAE (its
critic by the model's size: a value head on this small policy) → greedy held-out accuracy before and
after, with plots and a summary.json.
"""

from __future__ import annotations

import json
import math
import random
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..config.sizing import builtin_max_new_tokens
from ..config.train import TrainConfig
from ..presets import preset
from ..tasks.equations import BUILTIN_HEADS
from ..trainer.seeds import builtin_held_out_seed


def demo_ppo() -> TrainConfig:
    """The demo's PPO stage: the shipped preset ``ppo_lm/presets/demo_ppo.yaml`` over the defaults."""
    from ..config.io import load_yaml

    return load_yaml(preset("demo_ppo"), TrainConfig)


@dataclass
class DemoConfig:
    output_dir: str | None = None
    """Default: runs/demo-<timestamp>."""
    seed: int = 0
    """Seeds everything: the built-in model, the data, SFT, the reward model and PPO."""
    rlhf: bool = False
    """Train a reward model on preference pairs and run PPO against it (the verifier stays the gold metric)."""
    smoke: bool = False
    """Tiny sizes that run in seconds (wiring check, used by the tests)."""
    threads: int = 2
    """torch CPU threads; 0 = leave torch's default."""
    hidden_size: int = 64
    """Hidden size of the built-in model, a multiple of 8."""
    num_layers: int = 2
    """Transformer layers of the built-in model."""
    sft_demos: int = 4000
    """Demonstrations SFT trains on."""
    sft_error_rate: float = 0.3
    """Share of wrong answers in the SFT demonstrations, so SFT alone stays imperfect."""
    sft_steps: int = 400
    """SFT optimiser steps."""
    sft_lr: float = 1e-3
    """SFT learning rate."""
    sft_batch_size: int = 32
    """Demonstrations per SFT step."""
    eval_prompts: int = 200
    """Held-out prompts of the greedy accuracy (distinct equations of the held-out split, at most 300)."""
    eval_every: int = 50
    """Measure the held-out accuracy every this many PPO iterations (and after the last)."""
    rm_prompts: int = 4000
    """--rlhf: prompts the SFT policy samples responses to, for preference pairs."""
    rm_samples_per_prompt: int = 4
    """--rlhf: responses per prompt (>= 2: a pair needs a right and a wrong one)."""
    rm_steps: int = 1000
    """--rlhf: reward-model optimiser steps."""
    rm_batch_size: int = 32
    """--rlhf: pairs per reward-model step."""
    rm_lr: float = 5e-4
    """--rlhf: reward-model learning rate."""
    rm_min_pairs: int = 200
    """Pairs from policy samples are topped up with synthetic ones to at least this many."""
    ppo: TrainConfig = field(default_factory=demo_ppo)
    """The PPO stage (as `ppo-lm train`); its output_dir, seed, threads and models are set by the demo."""

    def shrink(self) -> None:
        self.sft_demos, self.sft_steps, self.eval_prompts, self.eval_every = 64, 4, 8, 1
        self.rm_prompts, self.rm_steps, self.rm_min_pairs = 16, 4, 16
        self.hidden_size = 32
        self.ppo.iterations = 2
        self.ppo.rollout.num_prompts = 8
        self.ppo.data.builtin_num_prompts = 64
        self.ppo.log.progress = False


BUILTIN_CONTEXT = 128  # max_position_embeddings of the built-in model (tasks.equations.tiny_model_config)
DEMO_OUTPUTS = ("summary.json", "sft", "rm", "ppo", "diagnostics.png")


def _out_dir(cfg: DemoConfig) -> Path:
    return Path(cfg.output_dir or f"runs/demo-{time.strftime('%Y%m%d-%H%M%S')}")


def check_demo(cfg: DemoConfig, out: Path) -> None:
    """Every setting of the demo, its output directory and its PPO stage's settings, before anything is
    built: a bad value is a :class:`ConfigError` naming the flag, not a failure minutes in."""
    from ..config.validate import validate_config
    from ..runtime.errors import ConfigError
    from ..runtime.files import prepare_output_dir
    from ..tasks.equations import make_prompts

    def need(ok: bool, name: str, want: str) -> None:
        if not ok:
            raise ConfigError(f"`{name}` must be {want}, got {getattr(cfg, name)!r}")

    need(cfg.threads >= 0, "threads", ">= 0 (0: torch's default)")
    step = 2 * BUILTIN_HEADS
    need(cfg.hidden_size >= step and cfg.hidden_size % step == 0, "hidden_size",
         f"a positive multiple of {step} (2 × the built-in model's {BUILTIN_HEADS} heads: RoPE splits each head's "
         "width in halves)")
    for name in ("num_layers", "sft_demos", "sft_steps", "sft_batch_size", "eval_prompts", "eval_every"):
        need(getattr(cfg, name) >= 1, name, ">= 1")
    need(math.isfinite(cfg.sft_error_rate) and 0 <= cfg.sft_error_rate <= 1, "sft_error_rate", "in [0, 1]")
    need(math.isfinite(cfg.sft_lr) and cfg.sft_lr > 0, "sft_lr", "a finite number > 0")
    if cfg.rlhf:
        for name in ("rm_prompts", "rm_steps", "rm_batch_size", "rm_min_pairs"):
            need(getattr(cfg, name) >= 1, name, ">= 1")
        need(cfg.rm_samples_per_prompt >= 2, "rm_samples_per_prompt", ">= 2 (a pair needs a right and a wrong response)")
        need(math.isfinite(cfg.rm_lr) and cfg.rm_lr > 0, "rm_lr", "a finite number > 0")
    try:
        make_prompts(cfg.eval_prompts, seed=builtin_held_out_seed(cfg.seed), split="heldout", unique=True)
    except ValueError as e:
        raise ConfigError(f"`eval_prompts`={cfg.eval_prompts}: {e}") from None
    ppo = cfg.ppo
    if builtin_max_new_tokens(ppo) >= BUILTIN_CONTEXT:
        raise ConfigError(f"`ppo.rollout.max_new_tokens`={ppo.rollout.max_new_tokens} leaves no room for a prompt in the "
                          f"built-in model's context of {BUILTIN_CONTEXT} tokens; lower it below {BUILTIN_CONTEXT}")
    try:
        validate_config(ppo, 1)
    except ConfigError as e:  # its fields are under ppo. here
        raise ConfigError(re.sub(r"`([a-z_][a-z0-9_.]*)`", r"`ppo.\1`", str(e))) from None

    try:
        prepare_output_dir(out, "output_dir")
    except ValueError as e:
        raise ConfigError(str(e)) from None
    found = [name for name in DEMO_OUTPUTS if (out / name).exists()]
    if found:
        raise ConfigError(f"`output_dir` {str(out)!r} already holds a demo ({', '.join(found)}); choose another "
                          "--output-dir (or leave it unset for a new runs/demo-<timestamp>)")


def _preference_pairs_from_policy(lm, tok, rows, samples: int, seed: int, max_new_tokens: int) -> list[dict]:
    """Pairs (correct over incorrect) from the policy's own samples, labelled by the verifier."""
    from ..rollout.sample.engine import TorchEngine
    from ..rollout.sample.producer import Producer
    from ..rollout.sample.sampling import SamplingParams
    from ..rollout.score.reward import response_texts
    from ..tasks.equations import verify

    prompts = [r["prompt"] for r in rows for _ in range(samples)]
    answers = [r["answer"] for r in rows for _ in range(samples)]
    params = SamplingParams(max_new_tokens=max_new_tokens, temperature=1.0, stop_token_ids=(tok.eos_token_id,))
    producer = Producer(TorchEngine(lm, pad_token_id=tok.pad_token_id), tok)
    texts = response_texts(tok, producer.produce(rows, samples=samples, sampling=params,
                                                 generator=torch.Generator().manual_seed(seed)))
    scores = verify(prompts, texts, answer=answers)
    rng = random.Random(seed)
    pairs = []
    for i in range(0, len(prompts), samples):
        good = sorted({texts[j] for j in range(i, i + samples) if scores[j] == 1.0})
        bad = sorted({texts[j] for j in range(i, i + samples) if scores[j] == 0.0})
        if good and bad:
            pairs.append({"prompt": prompts[i], "chosen": rng.choice(good), "rejected": rng.choice(bad)})
    return pairs


def _reward_model_stage(cfg: DemoConfig, lm, tok, out: Path, max_new: int, console) -> dict:
    """Train the demo's reward model on pairs from ``lm``'s own samples, labelled by the verifier."""
    from ..stages.rm import RMConfig, build_reward_model_from_policy_config, train_reward_model
    from ..tasks.equations import make_prompts, preference_pairs

    rows = make_prompts(cfg.rm_prompts, seed=cfg.seed + 20_000, split="train")
    pairs = _preference_pairs_from_policy(lm, tok, rows, cfg.rm_samples_per_prompt, cfg.seed, max_new)
    n_policy = len(pairs)
    if n_policy < cfg.rm_min_pairs:
        # A policy that is almost never (or always) right yields few mixed groups: top up with
        # synthetic pairs (correct answer over a plausible mistake) so the RM has data.
        pairs += preference_pairs(cfg.rm_min_pairs - n_policy, seed=cfg.seed)
    console.print(f"[bold]2. Reward model[/] on {len(pairs)} preference pairs ({n_policy} from policy samples)")
    rm = build_reward_model_from_policy_config(lm.config, causal_lm=lm, pad_token_id=tok.pad_token_id, seed=cfg.seed)
    rm_cfg = RMConfig(lr=cfg.rm_lr, max_steps=cfg.rm_steps, batch_size=cfg.rm_batch_size, log_every=10**9)
    rm_metrics = train_reward_model(rm, tok, pairs, rm_cfg, output_dir=out / "rm", seed=cfg.seed)
    console.print(f"   held-out pairwise accuracy: {rm_metrics['heldout_accuracy_after']:.1%}")
    return rm_metrics


def _print_summary(console, cfg: DemoConfig, acc_before: float, acc_after: float, wall: float, out: Path) -> None:
    from rich.table import Table

    table = Table(title=f"ppo-lm demo ({'RLHF with a learned reward model' if cfg.rlhf else 'verifier reward'})")
    table.add_column("held-out prompts")
    table.add_column("greedy accuracy", justify="right")
    table.add_row("after SFT", f"{acc_before:.1%}")
    table.add_row(f"after PPO ({cfg.ppo.iterations} it.)", f"{acc_after:.1%}")
    console.print(table)
    console.print(f"wall time {wall:.0f} s; outputs in {out}/ (summary.json, diagnostics.png, ppo/metrics.jsonl)")


def run_demo(cfg: DemoConfig) -> dict:
    from rich.console import Console

    from ..config.io import to_dict
    from ..reporting.plots import plot_proxy_vs_gold, plot_run
    from ..rollout.evaluate import greedy_eval
    from ..rollout.sample.engine import TorchEngine
    from ..rollout.sample.producer import Producer
    from ..stages.sft import SFTConfig, train_sft
    from ..tasks.equations import build_tiny_policy, build_tokenizer, make_prompts, sft_demonstrations, verify
    from ..trainer.ppo import PPOTrainer

    console = Console()
    if cfg.smoke:
        cfg.shrink()
    out = _out_dir(cfg)
    ppo = cfg.ppo
    ppo.output_dir = str(out / "ppo")
    ppo.seed = cfg.seed
    ppo.threads = cfg.threads
    ppo.model.policy = str(out / "sft")
    ppo.model.tokenizer = str(out / "sft")
    ppo.model.reward = str(out / "rm") if cfg.rlhf else "builtin:equations"
    ppo.model.gold_reward = "builtin:equations" if cfg.rlhf else ppo.model.gold_reward
    check_demo(cfg, out)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    t0 = time.perf_counter()
    max_new = builtin_max_new_tokens(cfg.ppo)  # the demo's model is small: an auto limit is the small one
    tok = build_tokenizer()
    held = make_prompts(cfg.eval_prompts, seed=builtin_held_out_seed(cfg.seed), split="heldout", unique=True)

    def accuracy(lm) -> float:
        return greedy_eval(Producer(TorchEngine(lm, pad_token_id=tok.pad_token_id), tok), held, verify,
                           max_new_tokens=max_new)[0]

    # 1. SFT on demonstrations with errors: the starting policy.
    console.print(f"[bold]1. SFT[/] on {cfg.sft_demos} demonstrations ({cfg.sft_error_rate:.0%} wrong)")
    lm = build_tiny_policy(tok, seed=cfg.seed, hidden_size=cfg.hidden_size, num_layers=cfg.num_layers)
    demos = sft_demonstrations(cfg.sft_demos, seed=cfg.seed, error_rate=cfg.sft_error_rate)
    # SFT's held-out loss on demonstrations of the held-out split's equations: unseen prompts, and SFT
    # keeps every training demonstration
    held_demos = sft_demonstrations(max(cfg.sft_demos // 10, 1), seed=cfg.seed + 30_000, error_rate=cfg.sft_error_rate,
                                    split="heldout")
    sft_metrics = train_sft(lm, tok, demos, SFTConfig(lr=cfg.sft_lr, max_steps=cfg.sft_steps, batch_size=cfg.sft_batch_size,
                                                      log_every=10**9), output_dir=out / "sft",
                            eval_rows=held_demos, seed=cfg.seed)
    acc_before = accuracy(lm)
    console.print(f"   held-out accuracy after SFT: {acc_before:.1%}")

    # 2. (RLHF) reward model on pairs from the SFT policy's own samples, labelled by the verifier.
    rm_metrics = _reward_model_stage(cfg, lm, tok, out, max_new, console) if cfg.rlhf else None

    # 3. PPO (GAE; `critic.kind` auto: a value head on the policy at this size, config/sizing.py).
    console.print(f"[bold]{3 if cfg.rlhf else 2}. PPO[/] for {ppo.iterations} iterations × {ppo.rollout.num_prompts} prompts")
    trainer = PPOTrainer(ppo)
    trainer.train(eval_fn=lambda it, tr: {"heldout_accuracy": accuracy(tr.models.policy.lm)}, eval_every=cfg.eval_every)
    acc_after = accuracy(trainer.models.policy.lm)
    wall = time.perf_counter() - t0

    plot_run(out / "ppo" / "metrics.jsonl", out / "diagnostics.png", title="ppo-lm demo: PPO on the equation task")
    if cfg.rlhf:
        plot_proxy_vs_gold(out / "ppo" / "metrics.jsonl", out / "proxy_vs_gold.png")
    summary = {
        "accuracy_before": acc_before,
        "accuracy_after": acc_after,
        "iterations": ppo.iterations,
        "wall_s": wall,
        "sft_heldout_loss_after": sft_metrics.get("heldout_loss_after"),
        "rm_heldout_accuracy": rm_metrics["heldout_accuracy_after"] if rm_metrics else None,
        "config": to_dict(cfg),
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2))

    _print_summary(console, cfg, acc_before, acc_after, wall, out)
    return summary


def cmd_demo(argv: list[str]) -> int:
    from .main import _parse, _run

    cfg = _parse(DemoConfig, argv, "ppo-lm demo", "SFT → PPO (or SFT → RM → PPO with --rlhf) on the built-in task.")
    return _run(lambda: run_demo(cfg))
