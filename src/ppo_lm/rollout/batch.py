"""Typed container of one rollout (SPEC §1.1): everything the update needs, detached data."""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace

import torch
from torch import Tensor

WIDTH_STEP = 16
"""Trimmed response widths are rounded up to a multiple of this (within the block): a few distinct
tensor shapes instead of one per longest response, so the memory allocator and oneDNN's per-shape
primitive cache reuse their buffers (peak memory stays flat). Padded positions are masked."""


def trimmed_width(longest: int, full: int) -> int:
    """Response width to keep for a longest response of ``longest`` tokens in a block of ``full``."""
    return min(-(-longest // WIDTH_STEP) * WIDTH_STEP, full)


def length_groups(lengths: Tensor, size: int = 0, *, prompt_width: int = 0,
                  max_groups: int = 4, num_groups: int = 0) -> list[tuple[Tensor, int]]:
    """Row groups for forwards whose cost should follow the real lengths: (row indices, response width).

    Rows are taken in order of response length, so each forward is cut to its own longest response
    (rounded up by :func:`trimmed_width`). ``size`` > 0: groups of that many rows. ``size`` = 0: the
    whole batch, or 2, 4, … ``max_groups`` equal groups (at least 8 rows each) when that saves at
    least 15 % of the positions, counted as rows × (``prompt_width`` + kept width); smaller forwards
    run their matmuls less efficiently, hence the margin. A row's results do not depend on its group:
    its tokens and mask are unchanged, and padding after a response cannot reach it (causal mask).
    ``num_groups`` > 0 forces that many equal groups (data-parallel ranks must agree on the count).

    lengths: (B,) response lengths. Returns the groups in order of length; every row appears once.
    """
    order = torch.argsort(lengths, stable=True)
    n = order.numel()
    full = int(lengths.max()) if n else 0

    def split(k: int) -> list[Tensor]:
        return [g for g in order.tensor_split(k) if g.numel()] if k > 1 else [order]

    def cost(groups: list[Tensor]) -> int:
        return sum(int(g.numel()) * (prompt_width + trimmed_width(int(lengths[g].max()), full)) for g in groups)

    if size:
        groups = [order[i : i + size] for i in range(0, n, size)]
    elif num_groups:
        groups = split(num_groups)
    else:
        k, best = 1, cost([order])
        cand = 2
        while cand <= max_groups and n >= 8 * cand:
            c = cost(split(cand))
            if c <= 0.85 * best:
                k, best = cand, c
            cand *= 2
        groups = split(k)
    return [(g, trimmed_width(int(lengths[g].max()), full)) for g in groups if g.numel()]


@dataclass
class RolloutBatch:
    """B episodes; P = prompt block width (left-padded), T = response block width (right-padded).

    input_ids, attention_mask: (B, P + T) prompt ‖ response.
    response_mask: (B, T) bool, valid response tokens (the stop token included).
    terminated: (B,) bool, True when a stop token ended the response (False = cut by the limit).
    logp_old, logp_ref: (B, T) log-probs of the sampled tokens under π_old and π_ref.
    values_old: (B, T) V_old(x_t), or None without a critic.
    bootstrap_values: (B,) V_old(x_{T_i+1}) (used for truncated rows), or None without a critic.
    scores: (B,) verifier / reward-model score (after the missing-EOS penalty).
    rewards: (B, T) shaped rewards; advantages, returns: (B, T) filled by the advantage step.
    gold_scores: (B,) monitoring-only verifier scores (``model.gold_reward``), or None.
    group_ids: (B,) index of the prompt each episode was sampled from (groups are contiguous).
    """

    input_ids: Tensor
    attention_mask: Tensor
    prompt_width: int
    response_mask: Tensor
    terminated: Tensor
    logp_old: Tensor
    logp_ref: Tensor
    scores: Tensor
    group_ids: Tensor
    values_old: Tensor | None = None
    bootstrap_values: Tensor | None = None
    rewards: Tensor | None = None
    advantages: Tensor | None = None
    returns: Tensor | None = None
    gold_scores: Tensor | None = None
    prompts: list[str] = field(default_factory=list)
    responses: list[str] = field(default_factory=list)

    @property
    def size(self) -> int:
        return self.input_ids.shape[0]

    @property
    def lengths(self) -> Tensor:
        return self.response_mask.sum(1)

    def select(self, idx: Tensor, *, trim: bool = True) -> RolloutBatch:
        """Rows ``idx``; with ``trim`` the response block is cut to the longest selected response
        (rounded up by :func:`trimmed_width`), so the update never pays for padding beyond it."""
        T = self.response_mask.shape[1]
        width = trimmed_width(int(self.response_mask[idx].sum(1).max()), T) if trim and idx.numel() else T
        out = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, Tensor):
                v = v[idx]
                if v.dim() == 2:
                    v = v[:, : self.prompt_width + width] if f.name in ("input_ids", "attention_mask") else v[:, :width]
            elif isinstance(v, list):
                v = [v[i] for i in idx.tolist()] if v else v
            out[f.name] = v
        return replace(self, **out)

    def to(self, device: torch.device | str) -> RolloutBatch:
        return replace(
            self, **{f.name: getattr(self, f.name).to(device) for f in fields(self) if isinstance(getattr(self, f.name), Tensor)}
        )
