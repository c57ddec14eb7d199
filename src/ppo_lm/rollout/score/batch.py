"""Typed containers of one rollout (docs/algorithm.md §1.1) and of the update's data (§1.4), and the row groups
that forwards over them run in."""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace

import torch
from torch import Tensor

from ...runtime import distributed as dist

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


def agreed_length_groups(lengths: Tensor, size: int = 0, *, prompt_width: int = 0) -> list[tuple[Tensor, int]]:
    """:func:`length_groups`, with as many groups on every data-parallel rank: sharded (FSDP) models
    all-gather in every forward and DDP's forward is a collective, so the ranks must run the same
    number of forwards. (``size`` > 0 fixes the count already: every rank has as many rows.)"""
    groups = length_groups(lengths, size, prompt_width=prompt_width)
    if not size and dist.world_size() > 1:
        k = int(dist.all_reduce_max(torch.tensor(len(groups))))
        if k != len(groups):
            groups = length_groups(lengths, num_groups=k, prompt_width=prompt_width)
    return groups


def select_rows(batch, idx: Tensor, trim: bool):
    """Rows ``idx`` of a batch dataclass; with ``trim`` the response block is cut to the longest
    selected response (rounded up by :func:`trimmed_width`), so a forward never pays for padding
    beyond it."""
    T = batch.response_mask.shape[1]
    width = trimmed_width(int(batch.response_mask[idx].sum(1).max()), T) if trim and idx.numel() else T
    out = {}
    for f in fields(batch):
        v = getattr(batch, f.name)
        if isinstance(v, Tensor):
            v = v[idx]
            if v.dim() == 2:
                v = v[:, : batch.prompt_width + width] if f.name in ("input_ids", "attention_mask") else v[:, :width]
        elif isinstance(v, list):
            v = [v[i] for i in idx.tolist()] if v else v
        elif isinstance(v, dict):
            v = {k: s[idx] for k, s in v.items()}
        out[f.name] = v
    return replace(batch, **out)


@dataclass(frozen=True)
class RolloutBatch:
    """Step 1's output (docs/algorithm.md §1.1): B episodes; P = prompt block width (left-padded), T = response
    block width (right-padded). Detached data.

    input_ids, attention_mask: (B, P + T) prompt ‖ response.
    response_mask: (B, T) bool, valid response tokens (the stop token included); in a multi-turn
        episode every token after the first prompt, the observations between turns included.
    action_mask: (B, T) bool, the tokens the policy sampled — a multi-turn episode's turns, with holes
        at its observation tokens (:mod:`ppo_lm.rollout.sample.producer`); None for single-turn (= response_mask).
        Losses, the KL, entropy, values and advantages are over :attr:`loss_mask`.
    episode_info: multi-turn only, (B,) tensors by name: ``turns``, ``observation_tokens``,
        ``context_truncated`` (an observation did not fit ``rollout.max_episode_tokens``); else None.
    turn_index: multi-turn only, (B, T) int64: each response token's turn, 0-based — the turn that
        sampled it, or for an observation token the turn it answers; −1 on padding. It delimits turns
        that follow each other with no observation between them (an environment's ``None`` answer),
        which ``action_mask`` alone shows as one run. Turn k's reward sits on its last action token:
        ``step_rewards`` there, ``scores`` for the last turn. None for single-turn.
    terminated: (B,) bool, True when a stop token ended the response (False = cut by the limit).
    logp_old, logp_ref: (B, T) log-probs of the sampled tokens under π_old and π_ref.
    scores: (B,) verifier / reward-model score (after the missing-EOS penalty).
    values_old: (B, T) V_old(x_t), or None without a critic.
    bootstrap_values: (B,) V_old(x_{T_i+1}) (used for truncated rows), or None without a critic.
    step_rewards: (B, T) fp32 step rewards on the tokens that complete their steps (0 elsewhere), and
        step_counts: (B,) int64 steps per response; None when the reward returned numbers only
        (:mod:`ppo_lm.rollout.score.step_rewards`).
    gold_scores: (B,) monitoring-only verifier scores (``model.gold_reward``), or None.
    score_terms: with several rewards, each one's (B,) scores by name (``scores`` is their weighted
        sum); None with one.
    logp_behaviour: (B, T) the sampler's log-probs of the sampled tokens (0 elsewhere), and versions: (B,)
        int64 the version of the weights that sampled each episode (:mod:`ppo_lm.rollout.trajectory`);
        None where a batch was built without a producer.
    prompts, responses: the texts, for the samples log.
    Episodes are laid out group-contiguous: [p0s0, p0s1, …, p1s0, …].
    """

    input_ids: Tensor
    attention_mask: Tensor
    prompt_width: int
    response_mask: Tensor
    terminated: Tensor
    logp_old: Tensor
    logp_ref: Tensor
    scores: Tensor
    values_old: Tensor | None = None
    bootstrap_values: Tensor | None = None
    action_mask: Tensor | None = None
    episode_info: dict[str, Tensor] | None = None
    turn_index: Tensor | None = None
    step_rewards: Tensor | None = None
    step_counts: Tensor | None = None
    gold_scores: Tensor | None = None
    score_terms: dict[str, Tensor] | None = None
    logp_behaviour: Tensor | None = None
    versions: Tensor | None = None
    prompts: list[str] = field(default_factory=list)
    responses: list[str] = field(default_factory=list)

    @property
    def size(self) -> int:
        return self.input_ids.shape[0]

    @property
    def lengths(self) -> Tensor:
        return self.response_mask.sum(1)

    @property
    def loss_mask(self) -> Tensor:
        """(B, T) the tokens that carry losses, KL, values and advantages: the sampled ones."""
        return self.response_mask if self.action_mask is None else self.action_mask

    def select(self, idx: Tensor, *, trim: bool = True) -> RolloutBatch:
        """Rows ``idx`` (see :func:`select_rows`)."""
        return select_rows(self, idx, trim)
