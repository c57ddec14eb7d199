"""Every seed a run derives from its own (``seed``), in one place: which prompts an iteration uses and
in what order, the environments' episode seeds, and the seeds of the sampling, minibatch-shuffling
and held-out sampling generators — fixed functions of the run's seed, the iteration, the rank and the
row's place, so a resumed run sees the same data and its environments replay the same episodes, and
the episode seeds do not change with the number of ranks."""

from __future__ import annotations

import torch


def positions(iteration: int, *, per_iteration: int, rank: int, world: int) -> range:
    """This rank's share of ``iteration`` (1-based) as positions in the run's stream of prompt rows:
    ``per_iteration`` a step, split evenly over ``world`` ranks in rank order."""
    local = per_iteration // world
    start = (iteration - 1) * per_iteration + rank * local
    return range(start, start + local)


def prompt_indices(n_rows: int, iteration: int, *, per_iteration: int, rank: int, world: int, seed: int,
                   shuffle: bool) -> list[int]:
    """Indices into the ``n_rows`` training prompts of this rank's share of ``iteration`` (1-based).

    The iterations walk the data in order, ``per_iteration`` prompts each, split evenly over ``world``
    ranks; each pass over the data (an epoch) uses a fresh permutation seeded by ``seed`` and the epoch
    when ``shuffle``.
    """
    perms: dict[int, torch.Tensor] = {}
    out = []
    for pos in positions(iteration, per_iteration=per_iteration, rank=rank, world=world):
        epoch, i = divmod(pos, n_rows)
        if shuffle:
            if epoch not in perms:
                perms[epoch] = torch.randperm(n_rows, generator=torch.Generator().manual_seed(epoch_seed(seed, epoch)))
            i = int(perms[epoch][i])
        out.append(i)
    return out


TRAIN, HELD_OUT = 0, 1
"""The streams of episode seeds: training groups, and held-out rows (the same at every evaluation)."""

SEED_BITS = 32
"""Episode seeds lie in [0, 2³²): what every seeding API takes (``np.random.RandomState`` included)."""

_MIX = 0x9E3779B1  # odd: multiplying by it permutes the integers mod 2³²


def _offset(seed: int) -> int:
    """A 32-bit offset from the run's seed (any int, negative included), spread by SplitMix64's finaliser."""
    z = (seed * 0x9E3779B97F4A7C15) % 2**64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) % 2**64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) % 2**64
    return (z ^ (z >> 31)) % 2**SEED_BITS


def group_seed(seed: int, stream: int, index: int) -> int:
    """The environment seed of group ``index`` of ``stream`` in the run seeded ``seed``, in [0, 2³²).
    ``x = 2 · index + stream`` is distinct for every (stream, index) below 2³¹ groups a stream, and
    ``(x · _MIX + offset(seed)) mod 2³²`` maps distinct x to distinct seeds (a bijection mod 2³²), so no
    two groups of a run — on any rank, in any iteration, training or held out — share a seed."""
    if not 0 <= index < 2 ** (SEED_BITS - 1):
        raise ValueError(f"group index {index} outside [0, 2**31)")
    return ((2 * index + stream) * _MIX + _offset(seed)) % 2**SEED_BITS


def episode_seeds(seed: int, iteration: int, *, per_iteration: int, rank: int, world: int) -> list[int]:
    """A seed per group (prompt row) of this rank's share of ``iteration``: the group's position in the
    run's stream of rows (:func:`positions`), so the seeds do not depend on the number of ranks; the G
    episodes of a group share it (docs/environments.md)."""
    return [group_seed(seed, TRAIN, pos)
            for pos in positions(iteration, per_iteration=per_iteration, rank=rank, world=world)]


def held_out_seeds(seed: int, n_rows: int, *, rank: int, world: int) -> list[int]:
    """A seed per held-out row of this rank's share (rows ``rank``, ``rank + world``, …): the row's
    index among all held-out rows, the same at every evaluation and on any number of ranks."""
    return [group_seed(seed, HELD_OUT, i) for i in range(rank, n_rows, world)]


def epoch_seed(seed: int, epoch: int) -> int:
    """The permutation of the prompt rows in pass ``epoch`` over the data (``data.shuffle``)."""
    return seed + 7919 * epoch


def sampling_seed(seed: int, rank: int) -> int:
    """The rollout's sampling generator on ``rank`` (checkpointed: a resumed run continues its stream)."""
    return seed * 1000 + rank + 1


def producer_sampling_seed(seed: int, rank: int, iteration: int) -> int:
    """An asynchronous producer's sampling generator for ``iteration`` on ``rank``: one per iteration,
    so what it samples does not depend on when it samples (rollout/sources/async_source.py). In [0, 2³²): a CPU
    generator keeps a seed's low 32 bits only, so the run's seed must move those bits too. Distinct for
    every (iteration, rank) of a run below 2²⁰ iterations and 4096 ranks (a bijection mod 2³², as
    :func:`group_seed`), and spread across runs by the seed's offset."""
    if not 0 <= rank < 4096 or not 0 <= iteration < 2**20:
        raise ValueError(f"iteration {iteration} or rank {rank} outside [0, 2**20) × [0, 4096)")
    return ((iteration * 4096 + rank) * _MIX + _offset(seed ^ 0x5A5A5A5A)) % 2**SEED_BITS


def shuffle_seed(seed: int, rank: int) -> int:
    """The minibatch-shuffling generator on ``rank`` (checkpointed)."""
    return seed * 1000 + rank + 500


def held_out_sampling_seed(seed: int, iteration: int, rank: int) -> int:
    """The sampling of the held-out responses at ``iteration``: a generator of its own, so evaluating
    never moves the training's streams."""
    return seed * 1000 + 700 + iteration * 1009 + rank


def builtin_held_out_seed(seed: int) -> int:
    """The built-in task's held-out equations (disjoint from the training split by construction)."""
    return seed + 10_000


def task_held_out_seed(seed: int) -> int:
    """A reasoning-gym task's held-out problems: another stream of its generator than the training
    problems' (which take ``seed``); a question drawn by both is dropped from training."""
    return _offset(seed + 20_000)
