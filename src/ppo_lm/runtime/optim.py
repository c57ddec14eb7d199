"""The one optimiser and learning-rate schedule of every training stage (PPO's actor and critic, SFT,
the reward model), so that each decides weight decay and warm-up the same way.

- **Weight decay** applies to matrices only: parameters with fewer than 2 dimensions (biases, norm
  weights, a value head's bias) are exempt, as is usual for transformers (Loshchilov & Hutter 2019
  decouple the decay; GPT-2 and its successors exempt these parameters).
- **Warm-up** is linear over ``warmup_steps`` optimiser steps: step k (0-based) uses (k + 1)/warmup of
  the peak rate, so the first step already moves the weights and step ``warmup_steps`` − 1 reaches
  the peak. Then the rate stays (``constant``) or decays to 0 at the last step (``linear``, ``cosine``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
from torch import nn

LR_SCHEDULES = ("constant", "linear", "cosine")


def adamw(params: Iterable[nn.Parameter], lr: float, *, weight_decay: float = 0.0,
          betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8, fused: bool = False) -> torch.optim.AdamW:
    """AdamW over ``params`` (the trainable ones are passed): with ``weight_decay`` > 0 in two groups,
    matrices decayed and 1-D parameters not; without, in one (as checkpoints of earlier runs hold
    their optimiser state). ``fused``: one kernel per step where torch has it for these
    parameters (CPU since torch 2.4, CUDA) — the same update rule, rounded differently (≈ 1e-7
    relative); else (a device or dtype without the kernel) the plain loop."""
    params = list(params)
    groups = [{"params": params, "weight_decay": 0.0}]
    if weight_decay > 0:
        groups = [{"params": [p for p in params if p.ndim >= 2], "weight_decay": weight_decay},
                  {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}]
        groups = [g for g in groups if g["params"]]
    kwargs = dict(lr=lr, betas=tuple(betas), eps=eps)
    if fused:
        try:
            return torch.optim.AdamW(groups, fused=True, **kwargs)
        except (RuntimeError, ValueError):
            pass
    return torch.optim.AdamW(groups, **kwargs)


def lr_factor(step: int, schedule: str, warmup_steps: int, total_steps: int) -> float:
    """The share of the peak rate that optimiser step ``step`` (0-based) of ``total_steps`` uses."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule == "constant":
        return 1.0
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    if schedule == "linear":
        return 1.0 - progress
    if schedule == "cosine":
        return 0.5 * (1.0 + math.cos(math.pi * progress))
    raise ValueError(f"schedule must be one of {LR_SCHEDULES}, got {schedule!r}")


def lr_schedule(opt: torch.optim.Optimizer, schedule: str, warmup_steps: int,
                total_steps: int) -> torch.optim.lr_scheduler.LambdaLR:
    """The schedule of ``opt``: :func:`lr_factor` of each step; ``.step()`` once per optimiser step."""
    if schedule not in LR_SCHEDULES:
        raise ValueError(f"schedule must be one of {LR_SCHEDULES}, got {schedule!r}")
    return torch.optim.lr_scheduler.LambdaLR(
        opt, lambda step: lr_factor(step, schedule, warmup_steps, total_steps))
