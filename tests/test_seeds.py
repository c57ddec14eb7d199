"""trainer/seeds.py: which prompts each rank sees, against a naive loop and by coverage."""

import pytest
import torch

from ppo_lm.trainer.seeds import HELD_OUT, TRAIN, episode_seeds, group_seed, held_out_seeds, prompt_indices


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
    seeds = [s for it in (1, 2, 3) for r in (0, 1)
             for s in episode_seeds(7, it, per_iteration=32, rank=r, world=2)]
    assert len(set(seeds)) == len(seeds) == 96
    assert episode_seeds(7, 2, per_iteration=32, rank=1, world=2) == episode_seeds(7, 2, per_iteration=32, rank=1,
                                                                                  world=2)


def test_seeds_do_not_collide_at_scale():
    """8 ranks × 2048 groups per iteration, 3 iterations, plus the held-out rows: every seed of the run
    is distinct (the earlier formula's stride of 10,007 repeated 6,377 of iteration 2's seeds)."""
    train = [s for it in (1, 2, 3) for r in range(8)
             for s in episode_seeds(0, it, per_iteration=8 * 2048, rank=r, world=8)]
    held_out = [s for r in range(8) for s in held_out_seeds(0, 5000, rank=r, world=8)]
    assert len(train) == 3 * 8 * 2048 and len(held_out) == 5000
    assert len(set(train) | set(held_out)) == len(train) + len(held_out)
    assert all(0 <= s < 2**32 for s in train + held_out)  # np.random.RandomState takes them


@pytest.mark.parametrize("world", [2, 3, 8])
def test_seeds_do_not_depend_on_the_number_of_ranks(world):
    """The seeds of an iteration's groups, read in rank order, and the held-out rows' seeds, by row, are
    those of one rank — even when the held-out rows do not divide evenly (5 rows on 2 ranks)."""
    per = 24
    one = episode_seeds(3, 2, per_iteration=per, rank=0, world=1)
    assert [s for r in range(world) for s in episode_seeds(3, 2, per_iteration=per, rank=r, world=world)] == one
    n = 5
    by_row = {}
    for r in range(world):
        for row, s in zip(range(r, n, world), held_out_seeds(3, n, rank=r, world=world)):
            by_row[row] = s
    assert [by_row[i] for i in range(n)] == held_out_seeds(3, n, rank=0, world=1)
    assert len(set(by_row.values())) == n


def test_the_streams_and_runs_differ():
    assert group_seed(0, TRAIN, 5) != group_seed(0, HELD_OUT, 5) != group_seed(1, TRAIN, 5)
    assert len({group_seed(s, TRAIN, 0) for s in range(-50, 50)}) == 100  # negative run seeds too
    assert all(0 <= group_seed(s, st, i) < 2**32 for s in (-7, 0, 10**12) for st in (TRAIN, HELD_OUT)
               for i in (0, 1, 2**31 - 1))
    with pytest.raises(ValueError):
        group_seed(0, TRAIN, 2**31)


def test_the_seed_map_is_one_to_one():
    """x ↦ (x · _MIX + c) mod 2³² is a bijection: checked exactly on the 2²⁰ values of x below 2²⁰ and on
    a random sample spread over the whole range."""
    import random

    from ppo_lm.trainer.seeds import _MIX

    assert _MIX % 2 == 1
    for seed in (0, 3):
        assert len({group_seed(seed, TRAIN, i) for i in range(2**19)} | {group_seed(seed, HELD_OUT, i)
                                                                         for i in range(2**19)}) == 2**20
    xs = random.Random(0).sample(range(2**31), 100_000)
    assert len({group_seed(1, TRAIN, i) for i in xs}) == len(xs)


def test_a_producers_sampling_streams_differ_across_runs_iterations_and_ranks():
    """A CPU generator keeps a seed's low 32 bits only: the run's seed must move them, or every run
    would sample its iteration j with the same stream."""
    import torch

    from ppo_lm.trainer.seeds import producer_sampling_seed

    seeds = {producer_sampling_seed(s, r, j) for s in range(3) for r in range(4) for j in range(1, 200)}
    assert len(seeds) == 3 * 4 * 199 and all(0 <= x < 2**32 for x in seeds)
    firsts = {float(torch.rand(1, generator=torch.Generator().manual_seed(producer_sampling_seed(s, 0, 5))))
              for s in range(3)}
    assert len(firsts) == 3
