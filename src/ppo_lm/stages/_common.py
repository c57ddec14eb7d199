"""Optimiser, schedule, batching, settings checks, progress lines and saving shared by the SFT and
reward-model stages."""

from __future__ import annotations

import json
import math
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch

from ..data.rows import InputError
from ..runtime import optim
from ..runtime.settings import check_ranges, setting

# Files that mark a directory as holding a finished stage (or another ppo-lm output): a new stage
# refuses to write over them unless told to (``--overwrite``).
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json")
STAGE_OUTPUTS = ("config.json", *WEIGHT_FILES, "sft_metrics.json", "rm_metrics.json", "sft_log.jsonl",
                 "rm_log.jsonl", "metrics.jsonl", "checkpoints")


@dataclass
class StageConfig:
    """Settings of a training stage before PPO (SFT, the reward model): the optimiser, its schedule and
    the batching, each field with its range (checked by :func:`check_stage_config`). An *example* is
    a (prompt, response) row for SFT, a (prompt, chosen, rejected) pair for the reward model."""

    lr: float = setting(1e-4, gt=0, finite=True)
    """AdamW learning rate (the schedule's peak)."""
    epochs: int = setting(1, ge=1)
    """Passes over the training examples (unless max_steps is set)."""
    max_steps: int | None = setting(None, ge=1)
    """Optimiser steps to take; None: epochs decide."""
    batch_size: int = setting(16, ge=1)
    """Examples per optimiser step."""
    eval_batch_size: int = setting(64, ge=1)
    """Examples per forward pass of the held-out evaluation (and of the reward model's normalisation)."""
    max_length: int = setting(512, ge=2)
    """Longest prompt + response + EOS in tokens (each side of a pair); longer examples are skipped, not
    truncated. At least 2: a prompt token and the EOS."""
    heldout_fraction: float = setting(0.1, ge=0, lt=1)
    """Share of the examples held out for the before/after evaluation, whole prompts at a time; used
    only without eval_data."""
    weight_decay: float = setting(0.0, ge=0, finite=True)
    """AdamW's decoupled weight decay of the weight matrices (biases and norm weights exempt,
    ppo_lm.runtime.optim); 0 = none."""
    warmup_steps: int = setting(0, ge=0)
    """Linear learning-rate warm-up, in optimiser steps (step k uses (k+1)/warmup_steps of lr); 0 = none."""
    schedule: Literal["constant", "linear", "cosine"] = "constant"
    """Learning-rate schedule after the warm-up: constant, or linear/cosine decay to 0 at the last step."""
    max_grad_norm: float | None = setting(1.0, ge=0, finite=True)
    """Clip the global gradient norm to this; None or 0 = no clipping."""
    log_every: int = setting(10, ge=0)
    """Print a progress line (loss and the stage's metrics, lr, step/total) every this many steps and at
    the last; 0 = never."""
    add_special_tokens: bool = True
    """Let the tokenizer add its special tokens (e.g. a BOS) to a text prompt, as the PPO rollout's
    tokenizer call does. Prompts of chat messages get none added: the chat template writes its own."""


def check_stage_config(cfg: StageConfig, section: str) -> None:
    """Refuse an out-of-range setting of an SFT or reward-model stage (:class:`InputError` naming
    ``section.field``), before any model or data is touched."""
    check_ranges(cfg, f"{section}.", error=InputError)
    if cfg.schedule not in optim.LR_SCHEDULES:
        raise InputError(f"`{section}.schedule` must be one of {', '.join(optim.LR_SCHEDULES)}, got {cfg.schedule!r}")


def total_steps(n_rows: int, batch_size: int, epochs: int, max_steps: int | None) -> int:
    if batch_size < 1:
        raise InputError(f"batch_size must be >= 1, got {batch_size}")
    if max_steps is not None:
        if max_steps < 1:
            raise InputError(f"max_steps must be >= 1, got {max_steps}")
        return max_steps
    if epochs < 1:
        raise InputError(f"epochs must be >= 1 when max_steps is unset, got {epochs}")
    return epochs * math.ceil(n_rows / batch_size)


def batch_indices(n_rows: int, batch_size: int, n_steps: int, seed: int) -> Iterator[list[int]]:
    """``n_steps`` index batches, a fresh seeded permutation per epoch (last batch may be short)."""
    rng = random.Random(seed)
    step = 0
    while True:
        order = list(range(n_rows))
        rng.shuffle(order)
        for start in range(0, n_rows, batch_size):
            if step >= n_steps:
                return
            yield order[start : start + batch_size]
            step += 1


def make_optimizer(model: torch.nn.Module, lr: float, weight_decay: float) -> torch.optim.Optimizer:
    """:func:`ppo_lm.runtime.optim.adamw` over the model's trainable parameters."""
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise InputError("the model has no trainable parameters")
    return optim.adamw(params, lr, weight_decay=weight_decay)


def make_scheduler(opt: torch.optim.Optimizer, schedule: str, warmup_steps: int, n_steps: int):
    """:func:`ppo_lm.runtime.optim.lr_schedule` (linear warm-up, then constant, linear or cosine; the
    schedule's name is checked with the stage's settings, :func:`check_stage_config`)."""
    return optim.lr_schedule(opt, schedule, warmup_steps, n_steps)


def optimizer_step(
    model, opt, sched, loss: torch.Tensor, max_grad_norm: float | None, *, what: str, step: int
) -> float:
    """One optimiser step on ``loss``; returns the pre-clip gradient norm.

    Refuses a non-finite loss (``FloatingPointError`` naming ``what`` and ``step``) before touching the
    gradients, then zero_grad → backward → clip to ``max_grad_norm`` (no clipping when falsy) → step →
    sched. A finite loss whose gradient is not finite is refused the same way, before the step, so the
    weights (and what gets saved) never hold NaN/inf.
    """
    if not math.isfinite(loss.item()):
        raise FloatingPointError(f"{what} loss became {float(loss)} at step {step}; lower the lr")
    opt.zero_grad(set_to_none=True)
    loss.backward()
    grad_norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm or math.inf))
    if not math.isfinite(grad_norm):
        opt.zero_grad(set_to_none=True)
        raise FloatingPointError(f"{what} gradient norm became {grad_norm} at step {step} (finite loss "
                                 f"{float(loss):.4g}); lower the lr")
    opt.step()
    sched.step()
    return grad_norm


def window_log_entry(
    stage: str, step: int, n_steps: int, log_every: int, sched, grad_norm: float, **series: list[float]
) -> dict | None:
    """The log entry due at ``step`` (every ``log_every`` steps and at the last), else None.

    Each ``series`` becomes the mean of its last ``log_every`` values, placed after ``stage``/``step``/
    ``steps`` and before ``lr``/``grad_norm``. ``log_every`` 0 never logs.
    """
    if not (log_every and (step % log_every == 0 or step == n_steps)):
        return None
    entry: dict = {"stage": stage, "step": step, "steps": n_steps}
    for key, values in series.items():
        window = values[-log_every:]
        entry[key] = sum(window) / len(window)
    entry["lr"] = sched.get_last_lr()[0]
    entry["grad_norm"] = grad_norm
    return entry


def format_log_entry(entry: dict) -> str:
    """One plain line of a stage's log entry: ``sft step 10/250 loss 1.2345 lr 0.0001 grad_norm 0.53 ...``."""
    parts = [f"{entry['stage']} step {entry['step']}/{entry['steps']}"]
    for key, value in entry.items():
        if key in ("stage", "step", "steps"):
            continue
        if key == "lr":
            parts.append(f"lr {value:.3g}")
        elif isinstance(value, float):
            parts.append(f"{key} {value:.4g}" if key != "loss" else f"loss {value:.4f}")
        else:
            parts.append(f"{key} {value}")
    return " ".join(parts)


def model_device(model: torch.nn.Module) -> torch.device:
    return next(model.parameters()).device


def save_artifacts(output_dir, model, tokenizer, metrics: dict, metrics_name: str) -> None:
    """``save_pretrained`` model and tokenizer plus a JSON of the metrics into ``output_dir``.

    Weight files already there are removed first (unlinked, so a model still mapped from them keeps
    its data): a stale ``pytorch_model.bin`` or shard index next to the new weights would be loaded
    in their place."""
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    for f in out.iterdir():
        if f.is_file() and (f.name in WEIGHT_FILES or (f.name.startswith(("model-", "pytorch_model-"))
                                                      and f.suffix in (".safetensors", ".bin"))):
            f.unlink()
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    (out / metrics_name).write_text(json.dumps(metrics, indent=2))
