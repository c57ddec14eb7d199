"""KL estimators, reward shaping and β controllers (docs/algorithm.md §1.2) against hand computation."""

from __future__ import annotations

import math

import pytest
import torch
from algo_helpers import F64, garble, rand_mask
from hypothesis import given, settings
from hypothesis import strategies as st

from ppo_lm.algorithms import (
    KL_ESTIMATORS,
    AdaptiveKLController,
    FixedKLController,
    kl_penalty,
    shape_rewards,
)


def ref_kl(d: float, kind: str) -> float:
    if kind == "k1":
        return d
    if kind == "k2":
        return 0.5 * d * d
    return (math.exp(-d) - 1) + d


# ----------------------------------------------------------------------------- kl_penalty
def test_kl_penalty_hand_values():
    logp = torch.tensor([[-1.0, -2.0, -0.5]], dtype=F64)
    logp_ref = torch.tensor([[-1.5, -1.0, -0.5]], dtype=F64)  # d = 0.5, -1.0, 0.0
    torch.testing.assert_close(kl_penalty(logp, logp_ref, "k1"), torch.tensor([[0.5, -1.0, 0.0]], dtype=F64))
    torch.testing.assert_close(kl_penalty(logp, logp_ref, "k2"), torch.tensor([[0.125, 0.5, 0.0]], dtype=F64))
    k3 = torch.tensor([[math.exp(-0.5) - 0.5, math.exp(1.0) - 2.0, 0.0]], dtype=F64)
    torch.testing.assert_close(kl_penalty(logp, logp_ref, "k3"), k3, rtol=1e-14, atol=1e-15)
    assert torch.equal(kl_penalty(logp, logp_ref), kl_penalty(logp, logp_ref, "k1"))


@pytest.mark.parametrize("kind", KL_ESTIMATORS)
def test_kl_penalty_matches_loop(kind):
    g = torch.Generator().manual_seed(0)
    logp = -3 * torch.rand(4, 5, generator=g, dtype=F64)
    logp_ref = -3 * torch.rand(4, 5, generator=g, dtype=F64)
    out = kl_penalty(logp, logp_ref, kind)
    assert out.dtype == F64 and out.shape == (4, 5)
    d = (logp - logp_ref).tolist()
    ref = torch.tensor([[ref_kl(x, kind) for x in row] for row in d], dtype=F64)
    torch.testing.assert_close(out, ref, rtol=1e-13, atol=1e-14)


def test_kl_estimators_mc_unbiasedness():
    # k1 and k3 are unbiased for KL(p‖q) with samples from p; k2 is not (but close for nearby p, q).
    p = torch.tensor([0.5, 0.3, 0.15, 0.05], dtype=F64)
    q = torch.tensor([0.4, 0.4, 0.1, 0.1], dtype=F64)
    exact = float((p * (p / q).log()).sum())
    g = torch.Generator().manual_seed(1)
    y = torch.multinomial(p, 200_000, replacement=True, generator=g).view(1, -1)
    logp, logq = p.log()[y], q.log()[y]
    for kind in ("k1", "k3"):
        est = float(kl_penalty(logp, logq, kind).mean())
        assert abs(est - exact) < 0.01, (kind, est, exact)


@settings(max_examples=50, deadline=None)
@given(d=st.floats(-20, 20))
def test_k3_and_k2_are_nonnegative(d):
    a = torch.tensor([[d]], dtype=F64)
    z = torch.zeros(1, 1, dtype=F64)
    k3 = float(kl_penalty(a, z, "k3"))
    assert k3 >= 0.0
    assert float(kl_penalty(a, z, "k2")) >= 0.0
    if d == 0:
        assert k3 == 0.0
    assert math.isclose(k3, ref_kl(d, "k3"), rel_tol=1e-12, abs_tol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_k3_accurate_and_nonnegative_for_small_differences(dtype):
    # Policy and reference are close early in training: |d| ~ 1e-5..1e-2. k3 ≈ d²/2 must not be
    # swamped by the rounding error of e^{-d} − 1 (which would also make it negative).
    g = torch.Generator().manual_seed(4)
    d64 = torch.randn(20_000, generator=g, dtype=F64) * 10 ** (-5 + 3 * torch.rand(20_000, generator=g))
    d = d64.to(dtype).view(1, -1)
    k3 = kl_penalty(d, torch.zeros_like(d), "k3")
    assert bool((k3 >= 0).all())
    dd = d.double()
    exact = torch.expm1(-dd) + dd  # float64 reference on the same (rounded) inputs
    err = (k3.double() - exact).abs()
    # error of a few ulps of d (not of 1, which is what e^{-d} − 1 costs)
    assert bool((err <= 4 * torch.finfo(dtype).eps * dd.abs()).all())
    big = dd.abs() >= 1e-3
    assert float((err[big] / exact[big]).max()) < (1e-3 if dtype == torch.float32 else 1e-9)


def test_kl_penalty_unknown_kind():
    with pytest.raises(ValueError, match="kind"):
        kl_penalty(torch.zeros(1, 2), torch.zeros(1, 2), "k4")


# ----------------------------------------------------------------------------- shape_rewards
def ref_shape(scores, logp_old, logp_ref, mask, beta, kind):
    B, T = mask.shape
    out = [[0.0] * T for _ in range(B)]
    lo, lr, m, s = logp_old.tolist(), logp_ref.tolist(), mask.bool().tolist(), scores.tolist()
    for i in range(B):
        L = sum(m[i])
        for t in range(L):
            out[i][t] = -beta * ref_kl(lo[i][t] - lr[i][t], kind)
        out[i][L - 1] += s[i]
    return torch.tensor(out, dtype=F64)


@pytest.mark.parametrize("kind", KL_ESTIMATORS)
@pytest.mark.parametrize("beta", [0.0, 0.05, 1.0])
def test_shape_rewards_matches_loop(kind, beta):
    g = torch.Generator().manual_seed(2)
    mask = rand_mask(6, 7, g)
    lo = -3 * torch.rand(6, 7, generator=g, dtype=F64)
    lr = -3 * torch.rand(6, 7, generator=g, dtype=F64)
    scores = torch.randn(6, generator=g, dtype=F64)
    out = shape_rewards(scores, lo, lr, mask, kl_coef=beta, kl_estimator=kind)
    assert out.dtype == F64
    torch.testing.assert_close(out, ref_shape(scores, lo, lr, mask, beta, kind), rtol=1e-13, atol=1e-14)
    assert bool((out[~mask] == 0).all())
    # the total reward of a response is score − β·Σ kl_t
    kl_sum = (kl_penalty(lo, lr, kind) * mask).sum(1)
    torch.testing.assert_close(out.sum(1), scores - beta * kl_sum, rtol=1e-12, atol=1e-12)


def test_shape_rewards_hand_example():
    lo = torch.tensor([[-1.0, -1.0, -1.0], [-2.0, -0.5, -9.0]], dtype=F64)
    lr = torch.tensor([[-1.5, -0.5, -1.0], [-1.0, -1.0, -9.0]], dtype=F64)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    out = shape_rewards(torch.tensor([1.0, -2.0], dtype=F64), lo, lr, mask, kl_coef=0.1)
    expected = torch.tensor([[-0.05, 0.05, 1.0], [0.1, -0.05 - 2.0, 0.0]], dtype=F64)
    torch.testing.assert_close(out, expected, rtol=1e-13, atol=1e-14)


def test_shape_rewards_length_one_rows_and_float32():
    mask = torch.tensor([[1, 0, 0], [1, 1, 1]])
    lo = torch.tensor([[-1.0, 0.0, 0.0], [-1.0, -1.0, -1.0]])
    lr = torch.tensor([[-2.0, 0.0, 0.0], [-1.0, -1.0, -1.0]])
    out = shape_rewards(torch.tensor([3.0, 4.0]), lo, lr, mask, kl_coef=0.5)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, torch.tensor([[3.0 - 0.5, 0, 0], [0, 0, 4.0]]))


@pytest.mark.parametrize("kind", KL_ESTIMATORS)
def test_shape_rewards_padding_invariance(kind):
    g = torch.Generator().manual_seed(3)
    mask = rand_mask(6, 7, g)
    lo = -3 * torch.rand(6, 7, generator=g, dtype=F64)
    lr = -3 * torch.rand(6, 7, generator=g, dtype=F64)
    scores = torch.randn(6, generator=g, dtype=F64)
    clean = shape_rewards(scores, lo, lr, mask, kl_coef=0.1, kl_estimator=kind)
    dirty = shape_rewards(scores, garble(lo, mask), garble(lr, mask), mask, kl_coef=0.1, kl_estimator=kind)
    assert torch.equal(clean, dirty)
    assert bool((dirty[~mask] == 0).all())


def test_shape_rewards_bad_input():
    lo = torch.zeros(2, 3)
    ok_mask = torch.ones(2, 3)
    with pytest.raises(ValueError, match="empty row"):
        shape_rewards(torch.zeros(2), lo, lo, torch.tensor([[1, 1, 0], [0, 0, 0]]), kl_coef=0.1)
    with pytest.raises(ValueError, match="scores"):
        shape_rewards(torch.zeros(3), lo, lo, ok_mask, kl_coef=0.1)
    with pytest.raises(ValueError, match="logp_ref"):
        shape_rewards(torch.zeros(2), lo, torch.zeros(2, 4), ok_mask, kl_coef=0.1)
    with pytest.raises(ValueError, match="mask"):
        shape_rewards(torch.zeros(2), lo, lo, torch.tensor([[1, 0, 2], [1, 1, 1]]), kl_coef=0.1)
    with pytest.raises(ValueError, match="kl_coef"):
        shape_rewards(torch.zeros(2), lo, lo, ok_mask, kl_coef=-0.1)
    with pytest.raises(ValueError, match="kl_estimator"):
        shape_rewards(torch.zeros(2), lo, lo, ok_mask, kl_coef=0.1, kl_estimator="k9")


# ----------------------------------------------------------------------------- controllers
def test_fixed_kl_controller():
    c = FixedKLController(0.05)
    for kl in (0.0, 100.0, -3.0):
        c.update(kl, 64)
    assert c.value == 0.05
    c2 = FixedKLController(1.0)
    c2.load_state_dict(c.state_dict())
    assert c2.value == 0.05
    with pytest.raises(ValueError, match="kl_coef"):
        FixedKLController(-0.1)
    assert FixedKLController(0.0).value == 0.0


def test_adaptive_kl_controller_ziegler_update():
    c = AdaptiveKLController(0.1, target=6.0, horizon=10_000)
    beta = 0.1
    # (KL, n): error = clip(KL/target − 1, −0.2, 0.2)
    steps = [
        (6.6, 256, 0.1),
        (8.0, 256, 0.2),
        (100.0, 512, 0.2),
        (5.4, 256, -0.1),
        (0.0, 256, -0.2),
        (6.0, 64, 0.0),
        (-5.0, 128, -0.2),
    ]
    for kl, n, err in steps:
        c.update(kl, n)
        beta = beta * (1 + err * n / 10_000)
        assert math.isclose(c.value, beta, rel_tol=1e-12), (kl, c.value, beta)
    assert c.value != 0.1


def test_adaptive_kl_controller_moves_toward_target():
    c = AdaptiveKLController(0.2, target=1.0, horizon=100)
    c.update(5.0, 10)  # KL too high → β grows by at most 20%·n/horizon
    assert math.isclose(c.value, 0.2 * (1 + 0.2 * 0.1), rel_tol=1e-12)
    c.update(0.1, 10)  # KL too low → β shrinks
    assert c.value < 0.2 * 1.02


def test_adaptive_kl_controller_state_and_validation():
    c = AdaptiveKLController(0.1, target=6.0, horizon=1000)
    c.update(10.0, 100)
    sd = c.state_dict()
    assert sd["target"] == 6.0 and sd["horizon"] == 1000.0
    c2 = AdaptiveKLController(0.5, target=6.0, horizon=1000)
    c2.load_state_dict(sd)
    assert c2.value == c.value
    c.update(3.0, 10)
    c2.update(3.0, 10)
    assert c2.value == c.value
    with pytest.raises(ValueError, match="init_kl_coef"):
        AdaptiveKLController(-0.1, 6.0, 1000)
    with pytest.raises(ValueError, match="target"):
        AdaptiveKLController(0.1, 0.0, 1000)
    with pytest.raises(ValueError, match="horizon"):
        AdaptiveKLController(0.1, 6.0, 0)
