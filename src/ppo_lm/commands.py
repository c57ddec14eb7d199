"""`ppo-lm sft`, `ppo-lm rm` and `ppo-lm plot`: the stages around PPO, as commands."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field, replace
from pathlib import Path

from .stages.rm import RMConfig
from .stages.sft import SFTConfig


@dataclass
class SFTCommand:
    output_dir: str = "runs/sft"
    model: str = "builtin"
    """Causal LM checkpoint directory, or 'builtin' for the tiny Qwen2 model of the equation task."""
    data: str = "builtin:equations"
    """JSONL/Parquet/`datasets` directory with `prompt` and `response` columns, or 'builtin:equations'."""
    eval_data: str | None = None
    builtin_demos: int = 4000
    builtin_error_rate: float = 0.3
    builtin_hidden_size: int = 64
    seed: int | None = None
    """Seeds the whole command: the built-in model and data, the held-out split and the batch order.
    None: `sft.seed` does (default 0)."""
    threads: int = 0
    sft: SFTConfig = field(default_factory=SFTConfig)


@dataclass
class RMCommand:
    output_dir: str = "runs/rm"
    model: str = "builtin"
    """Causal LM checkpoint whose body initialises the reward model, or 'builtin'."""
    data: str = "builtin:equations"
    """JSONL/Parquet/`datasets` directory with `prompt`, `chosen`, `rejected`, or 'builtin:equations'."""
    eval_data: str | None = None
    builtin_pairs: int = 2000
    builtin_hidden_size: int = 64
    seed: int | None = None
    """Seeds the whole command: the built-in model and pairs, the held-out split and the batch order.
    None: `rm.seed` does (default 0)."""
    threads: int = 0
    rm: RMConfig = field(default_factory=RMConfig)


def _model_and_tokenizer(spec: str, seed: int, hidden: int):
    from transformers import AutoModelForCausalLM

    from .models.hf_compat import load_tokenizer
    from .tasks.equations import build_tiny_policy, build_tokenizer
    from .trainer.config_io import ConfigError

    if spec == "builtin":
        tok = build_tokenizer()
        return build_tiny_policy(tok, seed=seed, hidden_size=hidden), tok
    if not Path(spec).exists():
        raise ConfigError(f"`model`: no such checkpoint {spec!r} (models load offline only)")
    return AutoModelForCausalLM.from_pretrained(spec), load_tokenizer(spec)


def run_sft(c: SFTCommand) -> dict:
    import torch

    from .stages.sft import train_sft
    from .tasks.equations import sft_demonstrations

    if c.threads:
        torch.set_num_threads(c.threads)
    seed = c.sft.seed if c.seed is None else c.seed
    model, tok = _model_and_tokenizer(c.model, seed, c.builtin_hidden_size)
    rows = sft_demonstrations(c.builtin_demos, seed=seed, error_rate=c.builtin_error_rate) \
        if c.data == "builtin:equations" else c.data
    metrics = train_sft(model, tok, rows, replace(c.sft, seed=seed), output_dir=c.output_dir, eval_rows=c.eval_data)
    print(f"held-out loss {metrics['heldout_loss_before']:.4f} → {metrics['heldout_loss_after']:.4f}; "
          f"saved to {c.output_dir}")
    return metrics


def run_rm(c: RMCommand) -> dict:
    import torch

    from .stages.rm import build_reward_model_from_policy_config, train_reward_model
    from .tasks.equations import preference_pairs

    if c.threads:
        torch.set_num_threads(c.threads)
    seed = c.rm.seed if c.seed is None else c.seed
    lm, tok = _model_and_tokenizer(c.model, seed, c.builtin_hidden_size)
    rm = build_reward_model_from_policy_config(lm.config, causal_lm=lm, pad_token_id=tok.pad_token_id, seed=seed)
    rows = preference_pairs(c.builtin_pairs, seed=seed) if c.data == "builtin:equations" else c.data
    metrics = train_reward_model(rm, tok, rows, replace(c.rm, seed=seed), output_dir=c.output_dir,
                                 eval_rows=c.eval_data)
    print(f"held-out pairwise accuracy {metrics['heldout_accuracy_before']:.3f} → "
          f"{metrics['heldout_accuracy_after']:.3f}; saved to {c.output_dir}")
    return metrics


def cmd_sft(argv: list[str]) -> int:
    from .cli import _parse, _run

    c = _parse(SFTCommand, argv, "ppo-lm sft", "Supervised fine-tuning on (prompt, response) pairs.")
    return _run(lambda: run_sft(c))


def cmd_rm(argv: list[str]) -> int:
    from .cli import _parse, _run

    c = _parse(RMCommand, argv, "ppo-lm rm", "Bradley–Terry reward model on (prompt, chosen, rejected) pairs.")
    return _run(lambda: run_rm(c))


def cmd_plot(argv: list[str]) -> int:
    import argparse

    from .plots import plot_run

    p = argparse.ArgumentParser(prog="ppo-lm plot", description="PNG of a run's diagnostics over iterations.")
    p.add_argument("run_dir", help="an OUTPUT_DIR holding metrics.jsonl")
    p.add_argument("--out", default=None, help="PNG path (default RUN_DIR/diagnostics.png)")
    a = p.parse_args(argv)
    metrics = Path(a.run_dir) / "metrics.jsonl"
    if not metrics.is_file():
        print(f"ppo-lm: error: {metrics} not found", file=sys.stderr)
        return 2
    out = plot_run(metrics, a.out or Path(a.run_dir) / "diagnostics.png")
    print(out)
    return 0
