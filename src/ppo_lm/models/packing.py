"""Sequence packing: the real tokens of a padded (B, L) batch laid out in fewer rows.

Rollouts with early stops are mostly padding once they are cut to the longest response of a group.
Packing moves every sequence's real tokens (prompt ‖ response, pads dropped) into rows of the same
capacity, first-fit by decreasing length, so the forward runs over ≈ the real token count. Inside a
packed row each sequence keeps its own position ids (0 … n−1, as with the pads skipped) and attends
only to its own earlier tokens (a block-diagonal causal mask from the segment ids), so every real
token's hidden state is the one the padded batch gives (up to matmul summation order).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

CAPACITY_STEP = 16  # packed row widths are multiples of this: few distinct shapes


@dataclass
class PackPlan:
    """Where each real token goes. src_b, src_l: (N,) its row and column in the padded batch;
    dst_r, dst_c: (N,) its packed row and column; positions: (N,) its position id.
    rows × capacity: the packed layout; batch, length: the padded one."""

    src_b: Tensor
    src_l: Tensor
    dst_r: Tensor
    dst_c: Tensor
    positions: Tensor
    rows: int
    capacity: int
    batch: int
    length: int

    def pack(self, x: Tensor, fill: int | float = 0) -> tuple[Tensor, Tensor, Tensor]:
        """(B, L) token ids → packed ids (R, C), position ids (R, C) and segment ids (R, C) (the
        sequence index, −1 on empty slots)."""
        ids = x.new_full((self.rows, self.capacity), fill)
        ids[self.dst_r, self.dst_c] = x[self.src_b, self.src_l]
        pos = torch.zeros(self.rows, self.capacity, dtype=torch.long, device=x.device)
        pos[self.dst_r, self.dst_c] = self.positions
        seg = torch.full((self.rows, self.capacity), -1, dtype=torch.long, device=x.device)
        seg[self.dst_r, self.dst_c] = self.src_b
        return ids, pos, seg

    def keep(self, keep_from: int) -> Kept:
        """The packed slots of the tokens at padded positions ≥ ``keep_from`` (the only outputs a
        caller reads), as a per-row index for the last layer (``lean.forward_hidden(keep_index=)``)."""
        sel = self.src_l >= keep_from
        r, c = self.dst_r[sel], self.dst_c[sel]
        order = torch.argsort(r * self.capacity + c)
        counts = torch.bincount(r, minlength=self.rows)
        starts = counts.cumsum(0) - counts
        j = torch.empty_like(r)
        j[order] = torch.arange(r.numel(), device=r.device) - starts[r[order]]
        index = torch.zeros(self.rows, max(int(counts.max()), 1), dtype=torch.long, device=r.device)
        index[r, j] = c  # rows with fewer kept slots repeat slot 0 (computed, never read)
        return Kept(index, r, j, self.src_b[sel], self.src_l[sel] - keep_from, self.batch, self.length - keep_from)


@dataclass
class Kept:
    """index: (R, K) packed columns whose outputs are needed; row, slot: (N,) where each needed token's
    output lands in the (R, K, d) result; b, l: (N,) where it goes in the padded (B, width) layout."""

    index: Tensor
    row: Tensor
    slot: Tensor
    b: Tensor
    l: Tensor  # noqa: E741 - the padded column, as in (b, l)
    batch: int
    width: int

    def unpack(self, h: Tensor) -> Tensor:
        """(R, K, d) outputs at ``index`` → (B, width, d) padded, zeros at the pads (differentiable)."""
        out = h.new_zeros(self.batch, self.width, h.shape[-1])
        out[self.b, self.l] = h[self.row, self.slot]
        return out


def plan_packing(attention_mask: Tensor, *, min_saving: float = 0.2) -> PackPlan | None:
    """A packing of the real tokens of ``attention_mask`` (B, L), or None when it would save less
    than ``min_saving`` of the positions (or there is nothing to pack)."""
    valid = attention_mask.bool()
    B, L = valid.shape
    if B < 2:
        return None
    n = valid.sum(1).tolist()
    longest = max(n)
    if longest == 0:
        return None
    capacity = min(-(-longest // CAPACITY_STEP) * CAPACITY_STEP, L)
    if sum(n) > (1 - min_saving) * B * L:  # cannot save enough even if packed perfectly
        return None
    free: list[int] = []  # room left in each packed row
    row_of, offset_of = [0] * B, [0] * B
    for b in sorted(range(B), key=lambda i: -n[i]):  # first fit, longest first
        r = next((i for i, room in enumerate(free) if room >= n[b]), len(free))
        if r == len(free):
            free.append(capacity)
        row_of[b], offset_of[b] = r, capacity - free[r]
        free[r] -= n[b]
    if len(free) * capacity > (1 - min_saving) * B * L:
        return None
    src_b, src_l = valid.nonzero(as_tuple=True)
    positions = (valid.long().cumsum(1) - 1)[src_b, src_l]
    device = attention_mask.device
    dst_r = torch.tensor(row_of, device=device)[src_b]
    dst_c = torch.tensor(offset_of, device=device)[src_b] + positions
    return PackPlan(src_b, src_l, dst_r, dst_c, positions, len(free), capacity, B, L)
