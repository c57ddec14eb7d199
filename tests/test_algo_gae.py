"""GAE (docs/algorithm.md §1.3) against an independent closed-form reference written with plain Python loops.

The reference builds δ_t straight from the definition in docs/algorithm.md §1.3, per row:
    δ_t = r_t + γ·V_next − V_t, with V_next = V_{t+1} inside the response, 0 after the last token of
    a terminated response and bootstrap_value after the last token of a truncated one;
and sums Â_t = Σ_l (γλ)^l δ_{t+l} with nested loops (no reverse recursion).
"""

from __future__ import annotations

import math

import pytest
import torch
from algo_helpers import garble
from hypothesis import given, settings
from hypothesis import strategies as st

from ppo_lm.algorithms import gae


# ----------------------------------------------------------------------------- helpers
def make_batch(B: int, T: int, seed: int, dtype=torch.float64, min_len: int = 1):
    """Random right-padded batch with lengths in [min_len, T] and mixed terminated/truncated rows.

    Row 0 is full length and terminated, row 1 (if any) full length and truncated, so the last
    column and the bootstrap at the last column are always exercised.
    """
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(min_len, T + 1, (B,), generator=g)
    terminated = torch.rand(B, generator=g) < 0.5
    lengths[0] = T
    terminated[0] = True
    if B > 1:
        lengths[1] = T
        terminated[1] = False
    mask = torch.arange(T).unsqueeze(0) < lengths.unsqueeze(1)
    rewards = torch.randn(B, T, generator=g, dtype=dtype)
    values = torch.randn(B, T, generator=g, dtype=dtype)
    boot = torch.randn(B, generator=g, dtype=dtype)
    return rewards, values, mask, terminated, boot


def ref_deltas(rewards, values, mask, terminated, boot, gamma):
    """δ per row as Python lists (only valid positions)."""
    r, v, m = rewards.tolist(), values.tolist(), mask.bool().tolist()
    term = [True] * len(r) if terminated is None else [bool(t) for t in terminated.tolist()]
    bv = [0.0] * len(r) if boot is None else boot.tolist()
    out = []
    for i in range(len(r)):
        L = sum(m[i])
        row = []
        for t in range(L):
            if t + 1 < L:
                v_next = v[i][t + 1]
            elif term[i]:
                v_next = 0.0  # d_T = 1
            else:
                v_next = bv[i]  # truncation bootstrap
            row.append(r[i][t] + gamma * v_next - v[i][t])
        out.append(row)
    return out


def ref_gae(rewards, values, mask, terminated, boot, gamma, lam):
    """Closed form Â_t = Σ_l (γλ)^l δ_{t+l} with nested loops; returns (adv, ret) as (B, T) lists."""
    B, T = rewards.shape
    lams = lam.tolist() if isinstance(lam, torch.Tensor) else [lam] * B
    deltas = ref_deltas(rewards, values, mask, terminated, boot, gamma)
    v = values.tolist()
    adv = [[0.0] * T for _ in range(B)]
    ret = [[0.0] * T for _ in range(B)]
    for i in range(B):
        L = len(deltas[i])
        c = gamma * lams[i]
        for t in range(L):
            s = 0.0
            for k in range(L - t):
                s += c**k * deltas[i][t + k]  # 0.0**0 == 1.0
            adv[i][t] = s
            ret[i][t] = s + v[i][t]
    return adv, ret


def assert_close_list(x: torch.Tensor, ref, tol=1e-10):
    ref_t = torch.tensor(ref, dtype=x.dtype)
    torch.testing.assert_close(x, ref_t, rtol=tol, atol=tol)


# ----------------------------------------------------------------------------- reference checks
@pytest.mark.parametrize("gamma", [0.9, 1.0])
@pytest.mark.parametrize("lam", [0.0, 0.95, 1.0])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_gae_matches_closed_form(gamma, lam, seed):
    rewards, values, mask, terminated, boot = make_batch(6, 7, seed)
    adv, ret = gae(rewards, values, mask, gamma=gamma, lam=lam, terminated=terminated, bootstrap_values=boot)
    ref_adv, ref_ret = ref_gae(rewards, values, mask, terminated, boot, gamma, lam)
    assert adv.dtype == torch.float64 and ret.dtype == torch.float64
    assert_close_list(adv, ref_adv)
    assert_close_list(ret, ref_ret)
    assert bool((adv[~mask] == 0).all()) and bool((ret[~mask] == 0).all())


@pytest.mark.parametrize("gamma", [0.9, 1.0])
def test_gae_per_row_lambda_tensor(gamma):
    rewards, values, mask, terminated, boot = make_batch(5, 6, seed=11)
    lam = torch.tensor([0.0, 1.0, 0.95, 0.3, 0.7], dtype=torch.float32)  # float32 λ, float64 data
    adv, ret = gae(rewards, values, mask, gamma=gamma, lam=lam, terminated=terminated, bootstrap_values=boot)
    ref_adv, ref_ret = ref_gae(rewards, values, mask, terminated, boot, gamma, lam.double())
    assert adv.dtype == torch.float64
    # λ is float32 on input, so compare to the float32-rounded λ at float64 precision.
    assert_close_list(adv, ref_adv)
    assert_close_list(ret, ref_ret)
    # each row equals a scalar-λ call on that row
    for i in range(5):
        a_i, r_i = gae(
            rewards[i : i + 1],
            values[i : i + 1],
            mask[i : i + 1],
            gamma=gamma,
            lam=float(lam[i]),
            terminated=terminated[i : i + 1],
            bootstrap_values=boot[i : i + 1],
        )
        torch.testing.assert_close(adv[i : i + 1], a_i, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(ret[i : i + 1], r_i, rtol=1e-12, atol=1e-12)


def test_gae_terminated_none_means_all_terminated():
    rewards, values, mask, _, _ = make_batch(4, 5, seed=3)
    term = torch.ones(4, dtype=torch.bool)
    a1, r1 = gae(rewards, values, mask, gamma=0.9, lam=0.95)
    a2, r2 = gae(rewards, values, mask, gamma=0.9, lam=0.95, terminated=term)
    ref_adv, _ = ref_gae(rewards, values, mask, None, None, 0.9, 0.95)
    assert torch.equal(a1, a2) and torch.equal(r1, r2)
    assert_close_list(a1, ref_adv)


def test_gae_bootstrap_only_affects_truncated_rows():
    rewards, values, mask, terminated, boot = make_batch(6, 5, seed=4)
    a1, _ = gae(rewards, values, mask, gamma=0.9, lam=0.95, terminated=terminated, bootstrap_values=boot)
    a2, _ = gae(rewards, values, mask, gamma=0.9, lam=0.95, terminated=terminated, bootstrap_values=boot + 10)
    assert torch.equal(a1[terminated], a2[terminated])
    # a truncated row's last valid advantage moves by exactly γ·Δboot
    trunc_rows = (~terminated).nonzero().flatten().tolist()
    assert trunc_rows
    for i in trunc_rows:
        last = int(mask[i].sum()) - 1
        torch.testing.assert_close(a2[i, last] - a1[i, last], torch.tensor(9.0, dtype=torch.float64))


def test_gae_float32_stays_float32():
    rewards, values, mask, terminated, boot = make_batch(3, 4, seed=5, dtype=torch.float32)
    adv, ret = gae(rewards, values, mask, gamma=1.0, lam=0.95, terminated=terminated, bootstrap_values=boot)
    assert adv.dtype == torch.float32 and ret.dtype == torch.float32
    ref_adv, ref_ret = ref_gae(rewards, values, mask, terminated, boot, 1.0, 0.95)
    assert_close_list(adv, ref_adv, tol=1e-5)
    assert_close_list(ret, ref_ret, tol=1e-5)


def test_gae_mask_dtypes_equivalent():
    rewards, values, mask, terminated, boot = make_batch(4, 5, seed=6)
    kw = dict(gamma=0.9, lam=0.95, terminated=terminated, bootstrap_values=boot)
    outs = [gae(rewards, values, mk, **kw) for mk in (mask, mask.long(), mask.double())]
    for a, r in outs[1:]:
        assert torch.equal(a, outs[0][0]) and torch.equal(r, outs[0][1])


def test_gae_empty_row_is_all_zero():
    rewards, values, mask, terminated, boot = make_batch(3, 4, seed=7)
    mask[2] = False
    terminated[2] = False  # truncated empty row: nothing to bootstrap onto
    adv, ret = gae(rewards, values, mask, gamma=1.0, lam=0.95, terminated=terminated, bootstrap_values=boot)
    assert bool((adv[2] == 0).all()) and bool((ret[2] == 0).all())
    ref_adv, _ = ref_gae(rewards, values, mask, terminated, boot, 1.0, 0.95)
    assert_close_list(adv, ref_adv)


def test_gae_hand_example():
    # One terminated row of 3 tokens, γ=0.5, λ=0.5 → γλ=0.25.
    r = torch.tensor([[1.0, 0.0, 2.0]], dtype=torch.float64)
    v = torch.tensor([[0.5, 1.0, -1.0]], dtype=torch.float64)
    m = torch.ones(1, 3)
    d0 = 1.0 + 0.5 * 1.0 - 0.5  # 1.0
    d1 = 0.0 + 0.5 * -1.0 - 1.0  # -1.5
    d2 = 2.0 - -1.0  # 3.0 (terminal: no bootstrap)
    expected = [d0 + 0.25 * d1 + 0.0625 * d2, d1 + 0.25 * d2, d2]
    adv, ret = gae(r, v, m, gamma=0.5, lam=0.5)
    assert_close_list(adv, [expected])
    assert_close_list(ret, [[e + b for e, b in zip(expected, [0.5, 1.0, -1.0])]])
    # truncated with bootstrap 4 → δ2 += γ·4 = 2
    adv_t, _ = gae(
        r,
        v,
        m,
        gamma=0.5,
        lam=0.5,
        terminated=torch.tensor([False]),
        bootstrap_values=torch.tensor([4.0], dtype=torch.float64),
    )
    assert_close_list(adv_t, [[expected[0] + 0.0625 * 2, expected[1] + 0.25 * 2, expected[2] + 2]])


# ----------------------------------------------------------------------------- boundary identities
@pytest.mark.parametrize("gamma", [0.9, 1.0])
def test_gae_lambda_zero_is_one_step_td(gamma):
    rewards, values, mask, terminated, boot = make_batch(6, 6, seed=21)
    adv, ret = gae(rewards, values, mask, gamma=gamma, lam=0.0, terminated=terminated, bootstrap_values=boot)
    r, v = rewards.tolist(), values.tolist()
    for i in range(6):
        L = int(mask[i].sum())
        for t in range(L):
            if t + 1 < L:
                v_next = v[i][t + 1]
            else:
                v_next = 0.0 if bool(terminated[i]) else float(boot[i])
            target = r[i][t] + gamma * v_next
            assert math.isclose(float(adv[i, t]), target - v[i][t], rel_tol=1e-12, abs_tol=1e-12)
            assert math.isclose(float(ret[i, t]), target, rel_tol=1e-12, abs_tol=1e-12)


@pytest.mark.parametrize("gamma", [0.9, 1.0])
def test_gae_lambda_one_is_discounted_return_plus_bootstrap(gamma):
    rewards, values, mask, terminated, boot = make_batch(6, 6, seed=22)
    _, ret = gae(rewards, values, mask, gamma=gamma, lam=1.0, terminated=terminated, bootstrap_values=boot)
    # λ=1 returns do not depend on the critic at all
    _, ret2 = gae(
        rewards, values * 3 - 1, mask, gamma=gamma, lam=1.0, terminated=terminated, bootstrap_values=boot
    )
    torch.testing.assert_close(ret, ret2, rtol=1e-12, atol=1e-12)
    r = rewards.tolist()
    for i in range(6):
        L = int(mask[i].sum())
        for t in range(L):
            g = sum(gamma ** (k - t) * r[i][k] for k in range(t, L))
            if not bool(terminated[i]):
                g += gamma ** (L - t) * float(boot[i])
            assert math.isclose(float(ret[i, t]), g, rel_tol=1e-12, abs_tol=1e-12)


@pytest.mark.parametrize("lam", [0.0, 0.5, 0.95, 1.0])
@pytest.mark.parametrize("gamma", [0.9, 1.0])
def test_gae_exact_critic_gives_zero_advantages(gamma, lam):
    rewards, _, mask, terminated, boot = make_batch(6, 6, seed=23)
    r = rewards.tolist()
    values = torch.zeros_like(rewards)
    for i in range(6):
        L = int(mask[i].sum())
        for t in range(L):
            g = sum(gamma ** (k - t) * r[i][k] for k in range(t, L))
            if not bool(terminated[i]):
                g += gamma ** (L - t) * float(boot[i])
            values[i, t] = g
    adv, ret = gae(rewards, values, mask, gamma=gamma, lam=lam, terminated=terminated, bootstrap_values=boot)
    torch.testing.assert_close(adv, torch.zeros_like(adv), rtol=0, atol=1e-12)
    torch.testing.assert_close(ret, values * mask, rtol=1e-12, atol=1e-12)


# ----------------------------------------------------------------------------- padding invariance
@pytest.mark.parametrize("lam", [0.95, "tensor"])
def test_gae_padding_invariance(lam):
    rewards, values, mask, terminated, boot = make_batch(6, 7, seed=31)
    lam_v = torch.linspace(0, 1, 6, dtype=torch.float64) if lam == "tensor" else lam
    kw = dict(gamma=0.9, lam=lam_v, terminated=terminated)
    clean_adv, clean_ret = gae(rewards, values, mask, bootstrap_values=boot, **kw)
    boot_bad = boot.clone()
    boot_bad[terminated] = float("nan")  # terminated rows' bootstrap values are never read
    adv, ret = gae(garble(rewards, mask), garble(values, mask), mask, bootstrap_values=boot_bad, **kw)
    assert torch.equal(adv, clean_adv) and torch.equal(ret, clean_ret)
    assert bool((adv[~mask] == 0).all()) and bool((ret[~mask] == 0).all())
    assert bool(torch.isfinite(adv).all()) and bool(torch.isfinite(ret).all())


def test_gae_values_dtype_follows_rewards():
    rewards, values, mask, terminated, boot = make_batch(3, 4, seed=32)
    adv, ret = gae(
        rewards,
        values.float(),
        mask,
        gamma=1.0,
        lam=0.95,
        terminated=terminated,
        bootstrap_values=boot.float(),
    )
    assert adv.dtype == torch.float64 and ret.dtype == torch.float64


def test_gae_no_gradient_required_and_outputs_detached_from_values():
    # GAE consumes data; it must run fine on detached inputs and produce a plain tensor.
    rewards, values, mask, terminated, boot = make_batch(3, 4, seed=33)
    adv, _ = gae(rewards, values, mask, gamma=1.0, lam=0.95, terminated=terminated, bootstrap_values=boot)
    assert not adv.requires_grad


# ----------------------------------------------------------------------------- property tests
@settings(max_examples=60, deadline=None)
@given(
    B=st.integers(1, 5),
    T=st.integers(1, 8),
    seed=st.integers(0, 2**31 - 1),
    gamma=st.floats(0.0, 1.0),
    lam=st.floats(0.0, 1.0),
    per_row=st.booleans(),
)
def test_gae_property_matches_closed_form(B, T, seed, gamma, lam, per_row):
    rewards, values, mask, terminated, boot = make_batch(B, T, seed)
    lam_v = (
        torch.rand(B, generator=torch.Generator().manual_seed(seed + 1), dtype=torch.float64)
        if per_row
        else lam
    )
    adv, ret = gae(
        rewards, values, mask, gamma=gamma, lam=lam_v, terminated=terminated, bootstrap_values=boot
    )
    ref_adv, ref_ret = ref_gae(rewards, values, mask, terminated, boot, gamma, lam_v)
    assert_close_list(adv, ref_adv, tol=1e-9)
    assert_close_list(ret, ref_ret, tol=1e-9)
    assert bool((adv[~mask] == 0).all())


@settings(max_examples=30, deadline=None)
@given(B=st.integers(1, 4), T=st.integers(1, 6), seed=st.integers(0, 2**31 - 1), gamma=st.floats(0.0, 1.0))
def test_gae_property_linear_in_rewards_and_shift(B, T, seed, gamma):
    # Advantages are linear in (rewards, values, bootstrap) jointly.
    r1, v1, mask, term, b1 = make_batch(B, T, seed)
    r2, v2, _, _, b2 = make_batch(B, T, seed + 7)
    kw = dict(gamma=gamma, lam=0.8, terminated=term)
    a1, _ = gae(r1, v1, mask, bootstrap_values=b1, **kw)
    a2, _ = gae(r2, v2, mask, bootstrap_values=b2, **kw)
    a12, _ = gae(2 * r1 - r2, 2 * v1 - v2, mask, bootstrap_values=2 * b1 - b2, **kw)
    torch.testing.assert_close(a12, 2 * a1 - a2, rtol=1e-9, atol=1e-9)


# ----------------------------------------------------------------------------- bad input
def _ok():
    rewards, values, mask, terminated, boot = make_batch(3, 4, seed=41)
    return dict(
        rewards=rewards,
        values=values,
        mask=mask,
        gamma=0.9,
        lam=0.95,
        terminated=terminated,
        bootstrap_values=boot,
    )


@pytest.mark.parametrize(
    "change, name",
    [
        (dict(values=torch.zeros(3, 5, dtype=torch.float64)), "values"),
        (dict(mask=torch.ones(3, 5)), "mask"),
        (dict(rewards=torch.zeros(12, dtype=torch.float64)), "rewards"),
        (dict(mask=torch.tensor([[1, 0, 1, 0], [1, 1, 1, 1], [1, 0, 0, 0]])), "mask"),
        (dict(mask=torch.tensor([[1, 2, 1, 0], [1, 1, 1, 1], [1, 0, 0, 0]])), "mask"),
        (dict(gamma=1.5), "gamma"),
        (dict(gamma=-0.1), "gamma"),
        (dict(gamma=float("nan")), "gamma"),
        (dict(lam=1.01), "lam"),
        (dict(lam=-0.5), "lam"),
        (dict(lam=torch.tensor([0.5, 1.5, 0.2])), "lam"),
        (dict(lam=torch.tensor([0.5, float("nan"), 0.2])), "lam"),
        (dict(lam=torch.tensor([0.5, 0.5])), "lam"),
        (dict(terminated=torch.tensor([True, False])), "terminated"),
        (dict(bootstrap_values=None), "bootstrap_values"),
        (dict(bootstrap_values=torch.zeros(2, dtype=torch.float64)), "bootstrap_values"),
    ],
)
def test_gae_bad_input(change, name):
    kw = _ok()
    kw["terminated"] = torch.tensor([True, False, False])
    kw.update(change)
    with pytest.raises(ValueError, match=name):
        gae(kw.pop("rewards"), kw.pop("values"), kw.pop("mask"), **kw)


def test_gae_no_bootstrap_needed_when_all_terminated():
    kw = _ok()
    kw["terminated"] = torch.ones(3, dtype=torch.bool)
    kw["bootstrap_values"] = None
    adv, _ = gae(kw.pop("rewards"), kw.pop("values"), kw.pop("mask"), **kw)
    assert bool(torch.isfinite(adv).all())
