"""trainer/schedule.py: which prompts each rank sees, against a naive loop and by coverage."""

import pytest
import torch

from ppo_lm.trainer.schedule import episode_seeds, prompt_indices


def naive(n, iteration, per_iteration, rank, world, seed, shuffle):
    # the whole permuted stream of every epoch written out, then this rank's slice of it
    stream = []
    for epoch in range(iteration * per_iteration // n + 2):
        order = list(range(n))
        if shuffle:
            order = torch.randperm(n, generator=torch.Generator().manual_seed(seed + 7919 * epoch)).tolist()
        stream += order
    local = per_iteration // world
    start = (iteration - 1) * per_iteration + rank * local
    return stream[start:start + local]


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("n,per_iteration,world", [(10, 4, 1), (7, 6, 2), (12, 12, 3), (5, 8, 4)])
def test_matches_naive_stream(n, per_iteration, world, shuffle):
    for iteration in range(1, 9):
        for rank in range(world):
            got = prompt_indices(n, iteration, per_iteration=per_iteration, rank=rank, world=world, seed=3,
                                 shuffle=shuffle)
            assert got == naive(n, iteration, per_iteration, rank, world, 3, shuffle)


@pytest.mark.parametrize("seed", [0, 1, 5])
def test_one_epoch_covers_every_row_once_across_ranks(seed):
    n, per_iteration, world = 24, 8, 2
    seen = [i for it in range(1, n // per_iteration + 1) for r in range(world)
            for i in prompt_indices(n, it, per_iteration=per_iteration, rank=r, world=world, seed=seed,
                                    shuffle=True)]
    assert sorted(seen) == list(range(n))
    assert seen != list(range(n))  # shuffled


def test_episode_seeds_are_distinct_across_ranks_and_iterations():
    seeds = [s for it in (1, 2, 3) for r in (0, 1) for s in episode_seeds(7, it, r, 16)]
    assert len(set(seeds)) == len(seeds)
    assert episode_seeds(7, 2, 1, 16) == episode_seeds(7, 2, 1, 16)
