"""Whitening, critic-free estimators (docs/algorithm.md §3), adaptive λ and the estimator registry."""

from __future__ import annotations

import math
import threading

import pytest
import torch
from algo_helpers import F64, garble, rand_mask
from hypothesis import given, settings
from hypothesis import strategies as st

from ppo_lm.algorithms import (
    ADVANTAGE_ESTIMATORS,
    AdvantageInputs,
    AdvantageSettings,
    adaptive_lambda,
    broadcast_to_tokens,
    compute_advantages,
    gae,
    get_advantage_estimator,
    grpo_advantages,
    masked_mean_var,
    reinforce_pp_advantages,
    rloo_advantages,
    whiten,
)


# ----------------------------------------------------------------------------- helpers
def valid_list(x: torch.Tensor, mask: torch.Tensor) -> list[float]:
    m = mask.bool().tolist()
    xs = x.tolist()
    return [xs[i][t] for i in range(len(m)) for t in range(len(m[0])) if m[i][t]]


def ref_whiten(x: torch.Tensor, mask: torch.Tensor, shift_mean=True, eps=1e-8) -> torch.Tensor:
    vals = valid_list(x, mask)
    n = len(vals)
    mu = sum(vals) / n
    var = sum((v - mu) ** 2 for v in vals) / (n - 1) if n > 1 else 0.0
    out = torch.zeros_like(x)
    m = mask.bool()
    for i in range(x.shape[0]):
        for t in range(x.shape[1]):
            if m[i, t]:
                w = (x[i, t].item() - mu) / math.sqrt(var + eps)
                out[i, t] = w if shift_mean else w + mu
    return out


def batch(B=6, T=7, seed=0):
    g = torch.Generator().manual_seed(seed)
    mask = rand_mask(B, T, g)
    x = 3 + 2 * torch.randn(B, T, generator=g, dtype=F64)
    return x, mask


class TwoRanks:
    """Run ``fn`` on two simulated ranks at once (threads) whose ``all_reduce`` sums over both, call
    by call, like torch.distributed's. ``calls`` counts the all-reduces of one rank."""

    def __init__(self):
        self.calls = 0

    def run(self, fn, shards: list[tuple]) -> list:
        barrier = threading.Barrier(2)
        slots: list = [None, None]
        results: list = [None, None]
        errors: list = []

        def rank(r: int):
            def all_reduce(t):
                slots[r] = t.clone()
                barrier.wait(timeout=30)
                total = slots[0] + slots[1]
                barrier.wait(timeout=30)  # both read the sums before the next call overwrites them
                if r == 0:
                    self.calls += 1
                return total

            try:
                results[r] = fn(*shards[r], all_reduce=all_reduce)
            except Exception as e:  # surfaced in the test thread
                errors.append(e)
                barrier.abort()

        threads = [threading.Thread(target=rank, args=(r,)) for r in (0, 1)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]
        return results


# ----------------------------------------------------------------------------- masked stats / whiten
def test_masked_mean_var_matches_torch_on_gathered_values():
    x, mask = batch(seed=1)
    vals = x[mask]
    mean, var = masked_mean_var(x, mask)
    torch.testing.assert_close(mean, vals.mean(), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(var, vals.var(unbiased=True), rtol=1e-10, atol=1e-12)
    _, var_b = masked_mean_var(x, mask, unbiased=False)
    torch.testing.assert_close(var_b, vals.var(unbiased=False), rtol=1e-10, atol=1e-12)
    mean_g, var_g = masked_mean_var(garble(x, mask), mask)
    assert torch.equal(mean_g, mean) and torch.equal(var_g, var)


def test_masked_mean_var_empty_mask():
    with pytest.raises(ValueError, match="mask"):
        masked_mean_var(torch.zeros(2, 3), torch.zeros(2, 3))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_whiten_zero_mean_unit_unbiased_std(seed):
    x, mask = batch(seed=seed)
    w = whiten(x, mask)
    assert w.dtype == F64
    vals = w[mask]
    assert abs(float(vals.mean())) < 1e-12
    torch.testing.assert_close(vals.std(), torch.tensor(1.0, dtype=F64), rtol=1e-7, atol=0)
    torch.testing.assert_close(w, ref_whiten(x, mask), rtol=1e-12, atol=1e-12)
    # exactly the z-score with torch.std of the gathered valid values
    xv = x[mask]
    torch.testing.assert_close(vals, (xv - xv.mean()) / torch.sqrt(xv.var() + 1e-8), rtol=1e-12, atol=1e-12)
    assert bool((w[~mask] == 0).all())


def test_whiten_shift_mean_false_keeps_mean():
    x, mask = batch(seed=3)
    w = whiten(x, mask, shift_mean=False)
    vals = w[mask]
    torch.testing.assert_close(vals.mean(), x[mask].mean(), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(vals.std(), torch.tensor(1.0, dtype=F64), rtol=1e-7, atol=0)
    torch.testing.assert_close(w, ref_whiten(x, mask, shift_mean=False), rtol=1e-12, atol=1e-12)
    assert bool((w[~mask] == 0).all())


def test_whiten_eps_and_float32():
    x, mask = batch(seed=4)
    torch.testing.assert_close(whiten(x, mask, eps=0.5), ref_whiten(x, mask, eps=0.5), rtol=1e-12, atol=1e-12)
    w32 = whiten(x.float(), mask)
    assert w32.dtype == torch.float32
    torch.testing.assert_close(w32, ref_whiten(x, mask).float(), rtol=1e-5, atol=1e-5)


def test_whiten_padding_invariance():
    x, mask = batch(seed=5)
    for shift in (True, False):
        clean = whiten(x, mask, shift_mean=shift)
        assert torch.equal(whiten(garble(x, mask), mask, shift_mean=shift), clean)


def test_whiten_single_valid_token_and_constant_are_finite():
    x = torch.tensor([[5.0, 1e30], [float("nan"), 0.0]], dtype=F64)
    mask = torch.tensor([[1, 0], [0, 0]])
    w = whiten(x, mask)
    assert torch.equal(w, torch.zeros_like(w))
    c = torch.full((2, 3), 4.0, dtype=F64)
    assert torch.equal(whiten(c, torch.ones(2, 3)), torch.zeros(2, 3, dtype=F64))


def test_whiten_all_reduce_equals_whitening_the_concatenated_batch():
    x, mask = batch(B=8, T=6, seed=6)
    full = whiten(x, mask)
    halves = [(x[:3], mask[:3]), (x[3:], mask[3:])]  # uneven split: 3 + 5 rows
    out = torch.cat(TwoRanks().run(whiten, halves))
    torch.testing.assert_close(out, full, rtol=1e-12, atol=1e-12)
    # without the reduction each rank would use its own (different) statistics
    local = torch.cat([whiten(xi, mi) for xi, mi in halves])
    assert not torch.allclose(local, full)


def test_whiten_fp32_large_mean_small_spread():
    """|mean| ≫ std in fp32 (scores near a constant): the one-pass E[x²] − mean² variance would be
    pure rounding noise here; the two-pass one matches the float64 result."""
    g = torch.Generator().manual_seed(3)
    mask = rand_mask(16, 8, g, min_len=2)
    x64 = 1000 + 0.01 * torch.randn(16, 8, generator=g, dtype=F64)
    x32 = x64.float()
    w = whiten(x32, mask)
    assert w.dtype == torch.float32
    torch.testing.assert_close(w.double(), whiten(x32.double(), mask), rtol=0, atol=0.05)


def test_whiten_bad_input():
    with pytest.raises(ValueError, match="mask"):
        whiten(torch.zeros(2, 3), torch.ones(2, 4))
    with pytest.raises(ValueError, match="mask"):
        whiten(torch.zeros(2, 3), torch.tensor([[1, 0, 5], [1, 1, 1]]))
    with pytest.raises(ValueError, match="mask"):
        whiten(torch.zeros(2, 3), torch.zeros(2, 3))


@settings(max_examples=40, deadline=None)
@given(
    B=st.integers(1, 5),
    T=st.integers(2, 6),
    seed=st.integers(0, 2**31 - 1),
    scale=st.floats(0.1, 100.0),
    shift=st.floats(-100.0, 100.0),
)
def test_whiten_property_invariances(B, T, seed, scale, shift):
    g = torch.Generator().manual_seed(seed)
    mask = rand_mask(B, T, g, min_len=2)
    x = torch.randn(B, T, generator=g, dtype=F64)
    w = whiten(x, mask, eps=0.0)
    # affine invariance (scale > 0), sign equivariance
    torch.testing.assert_close(whiten(scale * x + shift, mask, eps=0.0), w, rtol=1e-7, atol=1e-7)
    torch.testing.assert_close(whiten(-x, mask, eps=0.0), -w, rtol=1e-9, atol=1e-9)
    # row permutation equivariance
    perm = torch.randperm(B, generator=g)
    torch.testing.assert_close(whiten(x[perm], mask[perm], eps=0.0), w[perm], rtol=1e-9, atol=1e-9)
    # reference
    torch.testing.assert_close(w, ref_whiten(x, mask, eps=0.0), rtol=1e-9, atol=1e-9)


# ----------------------------------------------------------------------------- GRPO / Dr. GRPO / RLOO
def ref_grpo(scores: list[float], G: int, scale=True, eps=1e-6) -> list[float]:
    out = []
    for k in range(0, len(scores), G):
        grp = scores[k : k + G]
        mu = sum(grp) / G
        std = math.sqrt(sum((s - mu) ** 2 for s in grp) / (G - 1)) if G > 1 else 0.0
        out += [(s - mu) / (std + eps) if scale else s - mu for s in grp]
    return out


def ref_rloo(scores: list[float], G: int) -> list[float]:
    out = []
    for k in range(0, len(scores), G):
        grp = scores[k : k + G]
        for i in range(G):
            others = [grp[j] for j in range(G) if j != i]
            out.append(grp[i] - sum(others) / len(others))
    return out


@pytest.mark.parametrize("G", [2, 3, 4])
def test_grpo_matches_loop(G):
    g = torch.Generator().manual_seed(G)
    scores = torch.randn(5 * G, generator=g, dtype=F64)
    adv = grpo_advantages(scores, G)
    assert adv.shape == (5 * G,) and adv.dtype == F64
    torch.testing.assert_close(
        adv, torch.tensor(ref_grpo(scores.tolist(), G), dtype=F64), rtol=1e-12, atol=1e-12
    )
    torch.testing.assert_close(
        grpo_advantages(scores, G, eps=0.1), torch.tensor(ref_grpo(scores.tolist(), G, eps=0.1), dtype=F64)
    )


def test_grpo_hand_example_uses_unbiased_std_and_contiguous_groups():
    scores = torch.tensor([1.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 1.0], dtype=F64)
    # group 0 = [1, 0, 1, 0]: mean 0.5, unbiased std sqrt(1/3)
    adv = grpo_advantages(scores, 4, eps=0.0)
    s = math.sqrt(1 / 3)
    expected = [0.5 / s, -0.5 / s, 0.5 / s, -0.5 / s, -0.25 / 0.5, -0.25 / 0.5, -0.25 / 0.5, 0.75 / 0.5]
    torch.testing.assert_close(adv, torch.tensor(expected, dtype=F64), rtol=1e-12, atol=1e-12)
    # a group of identical scores has zero advantage (and no NaN)
    same = grpo_advantages(torch.ones(6, dtype=F64), 3)
    assert torch.equal(same, torch.zeros(6, dtype=F64))


def test_dr_grpo_drops_std_division():
    g = torch.Generator().manual_seed(7)
    scores = torch.randn(12, generator=g, dtype=F64)
    adv = grpo_advantages(scores, 4, scale_by_std=False)
    torch.testing.assert_close(
        adv, torch.tensor(ref_grpo(scores.tolist(), 4, scale=False), dtype=F64), rtol=1e-12, atol=1e-12
    )
    # group size 1 is allowed without std (advantage 0)
    assert torch.equal(grpo_advantages(scores, 1, scale_by_std=False), torch.zeros(12, dtype=F64))


@pytest.mark.parametrize("G", [2, 3, 5])
def test_rloo_matches_loop(G):
    g = torch.Generator().manual_seed(10 + G)
    scores = torch.randn(4 * G, generator=g, dtype=F64)
    adv = rloo_advantages(scores, G)
    torch.testing.assert_close(
        adv, torch.tensor(ref_rloo(scores.tolist(), G), dtype=F64), rtol=1e-12, atol=1e-12
    )


def test_rloo_hand_example():
    adv = rloo_advantages(torch.tensor([1.0, 0.0, 0.0, 3.0, 5.0, 4.0]), 3)
    torch.testing.assert_close(adv, torch.tensor([1.0, -0.5, -0.5, -1.5, 1.5, 0.0]))


@settings(max_examples=40, deadline=None)
@given(
    G=st.integers(2, 6),
    n=st.integers(1, 4),
    scores=st.lists(st.floats(-100, 100), min_size=24, max_size=24),
)
def test_rloo_and_grpo_group_properties(G, n, scores):
    s = torch.tensor(scores[: G * n], dtype=F64)
    rloo = rloo_advantages(s, G).view(n, G)
    # leave-one-out advantages sum to zero per group and are G/(G−1) × the mean-centred scores
    torch.testing.assert_close(rloo.sum(1), torch.zeros(n, dtype=F64), rtol=0, atol=1e-9)
    centred = s.view(n, G) - s.view(n, G).mean(1, keepdim=True)
    torch.testing.assert_close(rloo, centred * G / (G - 1), rtol=1e-9, atol=1e-9)
    dr = grpo_advantages(s, G, scale_by_std=False).view(n, G)
    torch.testing.assert_close(dr, centred, rtol=1e-9, atol=1e-9)
    grpo = grpo_advantages(s, G).view(n, G)
    torch.testing.assert_close(grpo.sum(1), torch.zeros(n, dtype=F64), rtol=0, atol=1e-6)
    torch.testing.assert_close(
        grpo, torch.tensor(ref_grpo(s.tolist(), G), dtype=F64).view(n, G), rtol=1e-9, atol=1e-9
    )


def test_group_estimators_bad_input():
    s = torch.zeros(6)
    for fn in (grpo_advantages, rloo_advantages):
        with pytest.raises(ValueError, match="group_size"):
            fn(s, 4)  # does not divide 6
        with pytest.raises(ValueError, match="group_size"):
            fn(s, 1)  # needs ≥ 2
        with pytest.raises(ValueError, match="group_size"):
            fn(s, 0)
        with pytest.raises(ValueError, match="scores"):
            fn(torch.zeros(2, 3), 3)
    with pytest.raises(ValueError, match="group_size"):
        grpo_advantages(s, 4, scale_by_std=False)


# ----------------------------------------------------------------------------- REINFORCE++
def ref_reinforce_pp(rewards, mask, gamma):
    B, T = rewards.shape
    r, m = rewards.tolist(), mask.bool().tolist()
    rtg = torch.zeros(B, T, dtype=F64)
    for i in range(B):
        L = sum(m[i])
        for t in range(L):
            rtg[i, t] = sum(gamma ** (k - t) * r[i][k] for k in range(t, L))
    return ref_whiten(rtg, mask)


@pytest.mark.parametrize("gamma", [1.0, 0.9])
def test_reinforce_pp_matches_loop(gamma):
    g = torch.Generator().manual_seed(20)
    mask = rand_mask(6, 7, g)
    rewards = torch.randn(6, 7, generator=g, dtype=F64)
    adv = reinforce_pp_advantages(rewards, mask, gamma=gamma)
    assert adv.dtype == F64
    torch.testing.assert_close(adv, ref_reinforce_pp(rewards, mask, gamma), rtol=1e-10, atol=1e-10)
    assert torch.equal(reinforce_pp_advantages(garble(rewards, mask), mask, gamma=gamma), adv)
    assert bool((adv[~mask] == 0).all())


def test_reinforce_pp_default_gamma_is_one_and_all_reduce():
    g = torch.Generator().manual_seed(21)
    mask = rand_mask(8, 5, g)
    rewards = torch.randn(8, 5, generator=g, dtype=F64)
    full = reinforce_pp_advantages(rewards, mask)
    torch.testing.assert_close(full, ref_reinforce_pp(rewards, mask, 1.0), rtol=1e-10, atol=1e-10)
    halves = [(rewards[:5], mask[:5]), (rewards[5:], mask[5:])]
    out = torch.cat(TwoRanks().run(reinforce_pp_advantages, halves))
    torch.testing.assert_close(out, full, rtol=1e-12, atol=1e-12)


def test_reinforce_pp_bad_input():
    with pytest.raises(ValueError, match="gamma"):
        reinforce_pp_advantages(torch.zeros(2, 3), torch.ones(2, 3), gamma=1.1)
    with pytest.raises(ValueError, match="mask"):
        reinforce_pp_advantages(torch.zeros(2, 3), torch.ones(3, 3))
    with pytest.raises(ValueError, match="mask"):
        reinforce_pp_advantages(torch.zeros(2, 3), torch.tensor([[1, 1, 1], [0, 1, 1]]))


# ----------------------------------------------------------------------------- adaptive λ, broadcast
def test_adaptive_lambda_matches_formula_and_clamps():
    lengths = torch.tensor([1, 10, 20, 21, 100, 1000])
    lam = adaptive_lambda(lengths, 0.05)
    expected = [min(max(1 - 1 / (0.05 * n), 0.0), 1.0) for n in lengths.tolist()]
    torch.testing.assert_close(lam, torch.tensor(expected, dtype=lam.dtype), rtol=1e-6, atol=1e-7)
    assert float(lam[0]) == 0.0 and float(lam[1]) == 0.0 and float(lam[2]) == 0.0
    assert lam.is_floating_point() and bool(((lam >= 0) & (lam <= 1)).all())
    lam64 = adaptive_lambda(torch.tensor([40.0, 400.0], dtype=F64), 0.05)
    assert lam64.dtype == F64
    torch.testing.assert_close(lam64, torch.tensor([0.5, 0.95], dtype=F64), rtol=1e-14, atol=1e-14)
    assert float(adaptive_lambda(torch.tensor([0]), 0.05)[0]) == 0.0  # empty response → λ = 0
    for alpha in (0.0, -1.0):
        with pytest.raises(ValueError, match="alpha"):
            adaptive_lambda(lengths, alpha)


def test_broadcast_to_tokens():
    mask = torch.tensor([[1, 1, 1], [1, 0, 0], [0, 0, 0]])
    out = broadcast_to_tokens(torch.tensor([2.0, -1.0, 5.0], dtype=F64), mask)
    assert out.dtype == F64
    assert torch.equal(out, torch.tensor([[2.0, 2.0, 2.0], [-1.0, 0.0, 0.0], [0.0, 0.0, 0.0]], dtype=F64))
    with pytest.raises(ValueError, match="seq_values"):
        broadcast_to_tokens(torch.zeros(2), mask)
    with pytest.raises(ValueError, match="mask"):
        broadcast_to_tokens(torch.zeros(3), torch.tensor([[0, 1, 2], [1, 0, 0], [0, 0, 0]]))


# ----------------------------------------------------------------------------- registry
def rollout(B=8, T=6, seed=30, group_size=4, with_values=True):
    g = torch.Generator().manual_seed(seed)
    mask = rand_mask(B, T, g)
    terminated = torch.rand(B, generator=g) < 0.5
    terminated[0], terminated[1] = True, False
    return AdvantageInputs(
        rewards=torch.randn(B, T, generator=g, dtype=F64),
        mask=mask,
        scores=torch.randn(B, generator=g, dtype=F64),
        terminated=terminated,
        values=torch.randn(B, T, generator=g, dtype=F64) if with_values else None,
        bootstrap_values=torch.randn(B, generator=g, dtype=F64),
        group_size=group_size,
    )


def _gae(x: AdvantageInputs, gamma, lam, rewards=None):
    return gae(
        x.rewards if rewards is None else rewards,
        x.values,
        x.mask,
        gamma=gamma,
        lam=lam,
        terminated=x.terminated,
        bootstrap_values=x.bootstrap_values,
    )


def test_registry_contents():
    assert set(ADVANTAGE_ESTIMATORS) == {"gae", "grpo", "dr_grpo", "rloo", "reinforce++"}
    assert get_advantage_estimator("gae").needs_critic
    for name in ("grpo", "dr_grpo", "rloo", "reinforce++"):
        assert not get_advantage_estimator(name).needs_critic
    for name in ("grpo", "dr_grpo", "rloo"):
        assert get_advantage_estimator(name).needs_groups
    assert not get_advantage_estimator("reinforce++").needs_groups


@pytest.mark.parametrize("gamma, lam", [(1.0, 0.95), (0.9, 0.0), (1.0, 1.0)])
def test_registry_gae_equals_gae(gamma, lam):
    x = rollout()
    adv, ret = compute_advantages("gae", x, AdvantageSettings(gamma=gamma, lam=lam))
    ref_adv, ref_ret = _gae(x, gamma, lam)
    assert torch.equal(adv, ref_adv) and torch.equal(ret, ref_ret)


def test_registry_default_settings():
    x = rollout()
    adv, ret = compute_advantages("gae", x)
    ref_adv, ref_ret = _gae(x, 1.0, 0.95)
    assert torch.equal(adv, ref_adv) and torch.equal(ret, ref_ret)


def test_registry_decoupled_critic_lambda():
    x = rollout()
    adv, ret = compute_advantages("gae", x, AdvantageSettings(gamma=1.0, lam=0.95, critic_lam=1.0))
    a_actor, r_actor = _gae(x, 1.0, 0.95)
    _, r_critic = _gae(x, 1.0, 1.0)
    torch.testing.assert_close(adv, a_actor, rtol=0, atol=0)
    torch.testing.assert_close(ret, r_critic, rtol=0, atol=0)
    assert not torch.allclose(ret, r_actor)


def test_registry_critic_rewards_target():
    x = rollout()
    crit_r = torch.zeros_like(x.rewards)
    crit_r[torch.arange(8), x.mask.sum(1) - 1] = x.scores  # score-only target
    x2 = AdvantageInputs(**{**x.__dict__, "critic_rewards": crit_r})
    adv, ret = compute_advantages("gae", x2, AdvantageSettings(gamma=1.0, lam=0.95))
    a_ref, r_actor = _gae(x, 1.0, 0.95)
    _, r_ref = _gae(x, 1.0, 0.95, rewards=crit_r)
    assert torch.equal(adv, a_ref) and torch.equal(ret, r_ref)
    assert not torch.allclose(ret, r_actor)


@pytest.mark.parametrize("critic_lam", [None, 1.0])
def test_registry_adaptive_lambda(critic_lam):
    x = rollout(B=6, T=40, seed=31)
    s = AdvantageSettings(gamma=1.0, lam=0.95, critic_lam=critic_lam, adaptive_lam_alpha=0.1)
    adv, ret = compute_advantages("gae", x, s)
    lam_rows = adaptive_lambda(x.mask.sum(1), 0.1).to(F64)
    a_ref, _ = _gae(x, 1.0, lam_rows)
    _, r_ref = _gae(x, 1.0, 0.95 if critic_lam is None else critic_lam)
    torch.testing.assert_close(adv, a_ref, rtol=0, atol=0)
    torch.testing.assert_close(ret, r_ref, rtol=0, atol=0)


@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "rloo"])
def test_registry_critic_free_broadcast(name):
    x = rollout(with_values=False)
    adv, ret = compute_advantages(name, x)
    assert ret is None
    seq = {
        "grpo": grpo_advantages(x.scores, 4),
        "dr_grpo": grpo_advantages(x.scores, 4, scale_by_std=False),
        "rloo": rloo_advantages(x.scores, 4),
    }[name]
    assert adv.shape == x.mask.shape
    for i in range(8):
        L = int(x.mask[i].sum())
        assert bool((adv[i, :L] == seq[i]).all())
        assert bool((adv[i, L:] == 0).all())


def test_registry_reinforce_pp():
    x = rollout(with_values=False)
    adv, ret = compute_advantages("reinforce++", x, AdvantageSettings(gamma=1.0))
    assert ret is None
    assert torch.equal(adv, reinforce_pp_advantages(x.rewards, x.mask, gamma=1.0))
    seen = []
    compute_advantages("reinforce++", x, all_reduce=lambda t: seen.append(t) or t)
    assert seen  # the all_reduce is passed through to the whitening


def test_registry_bad_input():
    x = rollout()
    for name in ("ppo2", "GAE", ""):
        with pytest.raises(ValueError, match=f"unknown advantage estimator '{name}'"):
            compute_advantages(name, x)
    with pytest.raises(ValueError, match="values"):
        compute_advantages("gae", rollout(with_values=False))
    with pytest.raises(ValueError, match="group_size"):
        compute_advantages("grpo", rollout(group_size=3))
    with pytest.raises(ValueError, match="group_size"):
        compute_advantages("rloo", rollout(group_size=1))
    x_nb = AdvantageInputs(**{**x.__dict__, "bootstrap_values": None})
    with pytest.raises(ValueError, match="bootstrap_values"):
        compute_advantages("gae", x_nb)
    with pytest.raises(ValueError, match="lam"):
        compute_advantages("gae", x, AdvantageSettings(lam=1.5))
    with pytest.raises(ValueError, match="lam"):
        compute_advantages("gae", x, AdvantageSettings(critic_lam=-0.5))
    with pytest.raises(ValueError, match="gamma"):
        compute_advantages("gae", x, AdvantageSettings(gamma=2.0))
    with pytest.raises(ValueError, match="alpha"):
        compute_advantages("gae", x, AdvantageSettings(adaptive_lam_alpha=0.0))


DOCUMENTED_LOSS_AGG = {
    # mirrors the registry's module docstring and docs/algorithm.md §3: token-mean for all but Dr. GRPO,
    # whose seq-mean-token-sum-norm is part of the estimator; not GRPO's paper's seq-mean-token-mean
    "gae": "token-mean",
    "grpo": "token-mean",
    "dr_grpo": "seq-mean-token-sum-norm",
    "rloo": "token-mean",
    "reinforce++": "token-mean",
}


def test_each_estimators_default_loss_aggregation_is_the_documented_one():
    """The registry's defaults, what ``algo.loss_agg: auto`` resolves to, and the table of docs/algorithm.md
    §3 agree; and the registry no longer says that each default is its paper's (GRPO's is not)."""
    import inspect
    import re
    from pathlib import Path

    from ppo_lm.algorithms import registry
    from ppo_lm.config.train import AlgoConfig
    from ppo_lm.config.validate import resolve_algo

    assert {n: s.loss_agg for n, s in registry.ADVANTAGE_ESTIMATORS.items()} == DOCUMENTED_LOSS_AGG
    assert {n: resolve_algo(AlgoConfig(estimator=n)).loss_agg for n in DOCUMENTED_LOSS_AGG} == DOCUMENTED_LOSS_AGG
    doc = (Path(__file__).parents[1] / "docs" / "algorithm.md").read_text(encoding="utf-8")
    rows = dict(re.findall(r"^\| `([a-z_+]+)` \| \w+ \| \w+ \| ([a-z-]+) \|$", doc, re.M))
    assert rows == DOCUMENTED_LOSS_AGG
    source = inspect.getsource(registry)
    assert "its paper uses" not in source and "seq-mean-token-mean" in registry.__doc__
