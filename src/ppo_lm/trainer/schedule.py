"""Which prompts and episode seeds an iteration uses: fixed functions of the run's seed, the iteration
and the rank, so a resumed run sees the same data and its environments replay the same episodes."""

from __future__ import annotations

import torch


def prompt_indices(n_rows: int, iteration: int, *, per_iteration: int, rank: int, world: int, seed: int,
                   shuffle: bool) -> list[int]:
    """Indices into the ``n_rows`` training prompts of this rank's share of ``iteration`` (1-based).

    The iterations walk the data in order, ``per_iteration`` prompts each, split evenly over ``world``
    ranks; each pass over the data (an epoch) uses a fresh permutation seeded by ``seed`` and the epoch
    when ``shuffle``.
    """
    local = per_iteration // world
    start = (iteration - 1) * per_iteration + rank * local
    perms: dict[int, torch.Tensor] = {}
    out = []
    for pos in range(start, start + local):
        epoch, i = divmod(pos, n_rows)
        if shuffle:
            if epoch not in perms:
                perms[epoch] = torch.randperm(n_rows, generator=torch.Generator().manual_seed(seed + 7919 * epoch))
            i = int(perms[epoch][i])
        out.append(i)
    return out


def episode_seeds(seed: int, iteration: int, rank: int, n: int) -> list[int]:
    """A seed per episode of this rank's ``n`` episodes of ``iteration``."""
    base = (seed * 1_000_003 + iteration) * 10_007 + rank * n
    return [base + i for i in range(n)]
