"""Optimiser, schedule, batching, settings checks, progress lines and saving shared by the SFT and
reward-model stages."""

from __future__ import annotations

import json
import math
import random
from collections.abc import Iterator
from pathlib import Path

import torch

from ..data.rows import InputError

LR_SCHEDULES = ("constant", "linear", "cosine")

# Files that mark a directory as holding a finished stage (or another ppo-lm output): a new stage
# refuses to write over them unless told to (``--overwrite``).
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json")
STAGE_OUTPUTS = ("config.json", *WEIGHT_FILES, "sft_metrics.json", "rm_metrics.json", "sft_log.jsonl",
                 "rm_log.jsonl", "metrics.jsonl", "checkpoints")


def check_stage_config(cfg, section: str) -> None:
    """Refuse an out-of-range setting of an SFT or reward-model stage (:class:`InputError` naming
    ``section.field``), before any model or data is touched."""

    def need(ok: bool, name: str, want: str) -> None:
        if not ok:
            raise InputError(f"`{section}.{name}` must be {want}, got {getattr(cfg, name)!r}")

    def number(v) -> bool:
        return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)

    need(number(cfg.lr) and cfg.lr > 0, "lr", "a finite number > 0")
    need(cfg.epochs >= 1, "epochs", ">= 1")
    need(cfg.max_steps is None or cfg.max_steps >= 1, "max_steps", ">= 1 (or unset: epochs decide)")
    need(cfg.batch_size >= 1, "batch_size", ">= 1")
    need(cfg.eval_batch_size >= 1, "eval_batch_size", ">= 1")
    need(cfg.max_length >= 2, "max_length", ">= 2 (a prompt token and the EOS)")
    need(number(cfg.heldout_fraction) and 0.0 <= cfg.heldout_fraction < 1.0, "heldout_fraction", "in [0, 1)")
    need(number(cfg.weight_decay) and cfg.weight_decay >= 0, "weight_decay", "a finite number >= 0")
    need(cfg.warmup_steps >= 0, "warmup_steps", ">= 0")
    need(cfg.schedule in LR_SCHEDULES, "schedule", f"one of {', '.join(LR_SCHEDULES)}")
    need(cfg.max_grad_norm is None or (number(cfg.max_grad_norm) and cfg.max_grad_norm >= 0), "max_grad_norm",
         "a finite number >= 0 (0 or unset: no clipping)")
    need(cfg.log_every >= 0, "log_every", ">= 0 (0: no progress lines)")


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
    """AdamW; biases and norm weights (1-D parameters) are exempt from weight decay, as usual."""
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise InputError("the model has no trainable parameters")
    decay = [p for p in params if p.ndim >= 2]
    no_decay = [p for p in params if p.ndim < 2]
    groups = [{"params": decay, "weight_decay": weight_decay}]
    if no_decay:
        groups.append({"params": no_decay, "weight_decay": 0.0})
    return torch.optim.AdamW(groups, lr=lr)


def make_scheduler(opt: torch.optim.Optimizer, schedule: str, warmup_steps: int, n_steps: int):
    """Linear warm-up over ``warmup_steps``, then constant, linear decay or cosine decay to 0."""
    if schedule not in LR_SCHEDULES:
        raise InputError(f"schedule must be one of {LR_SCHEDULES}, got {schedule!r}")

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        if schedule == "constant":
            return 1.0
        progress = min(1.0, (step - warmup_steps) / max(1, n_steps - warmup_steps))
        if schedule == "linear":
            return 1.0 - progress
        return 0.5 * (1.0 + math.cos(math.pi * progress))

    return torch.optim.lr_scheduler.LambdaLR(opt, factor)


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
