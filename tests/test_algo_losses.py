"""PPO losses, aggregation and diagnostics (docs/algorithm.md §1.4, §4) against plain-loop references."""

from __future__ import annotations

import math

import pytest
import torch
from algo_helpers import F64, garble, rand_mask
from hypothesis import given, settings
from hypothesis import strategies as st

from ppo_lm.algorithms import (
    AGG_MODES,
    aggregate,
    entropy_from_logits,
    explained_variance,
    get_policy_loss,
    pg_loss,
    policy_loss,
    value_loss,
)


# ----------------------------------------------------------------------------- helpers
def policy_batch(B=6, T=7, seed=0, spread=0.5):
    g = torch.Generator().manual_seed(seed)
    mask = rand_mask(B, T, g)
    logp_old = -torch.rand(B, T, generator=g, dtype=F64) * 3
    logp = logp_old + spread * torch.randn(B, T, generator=g, dtype=F64)
    adv = torch.randn(B, T, generator=g, dtype=F64)
    return logp, logp_old, adv, mask


def ref_policy_terms(logp, logp_old, adv, mask, eps_low, eps_high, dual_clip):
    """Per-token loss, per-token d loss/d logp, clip and dual-clip flags, from the definition."""
    B, T = logp.shape
    lp, lpo, A, m = logp.tolist(), logp_old.tolist(), adv.tolist(), mask.bool().tolist()
    loss = [[0.0] * T for _ in range(B)]
    grad = [[0.0] * T for _ in range(B)]
    clipped = [[False] * T for _ in range(B)]
    dual = [[False] * T for _ in range(B)]
    for i in range(B):
        for t in range(T):
            if not m[i][t]:
                continue
            rho = math.exp(lp[i][t] - lpo[i][t])
            a = A[i][t]
            rho_c = min(max(rho, 1 - eps_low), 1 + eps_high)
            unclipped, clip_term = -a * rho, -a * rho_c
            if clip_term > unclipped:
                val, g = clip_term, 0.0
                clipped[i][t] = True
            else:
                val, g = unclipped, -a * rho
            if dual_clip is not None and a < 0 and val > -dual_clip * a:
                val, g = -dual_clip * a, 0.0
                dual[i][t] = True
            loss[i][t], grad[i][t] = val, g
    return loss, grad, clipped, dual


def ref_aggregate(x, mask, mode, horizon=None):
    B, T = x.shape
    xs, m = x.tolist(), mask.bool().tolist()
    if mode == "token-mean":
        vals = [xs[i][t] for i in range(B) for t in range(T) if m[i][t]]
        return sum(vals) / max(len(vals), 1)
    if mode == "seq-mean-token-mean":
        means = []
        for i in range(B):
            row = [xs[i][t] for t in range(T) if m[i][t]]
            if row:
                means.append(sum(row) / len(row))
        return sum(means) / max(len(means), 1)
    if mode == "seq-mean-token-sum-norm":
        h = T if horizon is None else horizon
        return sum(sum(xs[i][t] for t in range(T) if m[i][t]) / h for i in range(B)) / B
    raise AssertionError(mode)


def ref_token_mean(vals2d, mask):
    m = mask.bool().tolist()
    v = [vals2d[i][t] for i in range(len(m)) for t in range(len(m[0])) if m[i][t]]
    return sum(v) / len(v)


def close(a, b, tol=1e-10):
    a = a.detach().item() if isinstance(a, torch.Tensor) else a
    b = b.detach().item() if isinstance(b, torch.Tensor) else b
    return math.isclose(float(a), float(b), rel_tol=tol, abs_tol=tol)


# ----------------------------------------------------------------------------- aggregate
@pytest.mark.parametrize("mode", AGG_MODES)
@pytest.mark.parametrize("seed", [0, 1])
def test_aggregate_modes_match_loops(mode, seed):
    g = torch.Generator().manual_seed(seed)
    mask = rand_mask(5, 6, g)
    x = torch.randn(5, 6, generator=g, dtype=F64)
    out = aggregate(x, mask, mode)
    assert out.dim() == 0 and out.dtype == F64
    assert close(out, ref_aggregate(x, mask, mode))
    assert torch.equal(aggregate(garble(x, mask), mask, mode), out)


def test_aggregate_default_is_token_mean_and_horizon():
    g = torch.Generator().manual_seed(3)
    mask = rand_mask(4, 5, g)
    x = torch.randn(4, 5, generator=g, dtype=F64)
    assert torch.equal(aggregate(x, mask), aggregate(x, mask, "token-mean"))
    h = 17.0
    assert close(
        aggregate(x, mask, "seq-mean-token-sum-norm", horizon=h),
        ref_aggregate(x, mask, "seq-mean-token-sum-norm", horizon=h),
    )


def test_aggregate_modes_differ_on_ragged_batch():
    # token-mean weights long responses more; seq-mean-token-mean weights responses equally.
    x = torch.tensor([[1.0, 1.0, 1.0, 1.0], [5.0, 0.0, 0.0, 0.0]], dtype=F64)
    mask = torch.tensor([[1, 1, 1, 1], [1, 0, 0, 0]])
    assert close(aggregate(x, mask, "token-mean"), 9 / 5)
    assert close(aggregate(x, mask, "seq-mean-token-mean"), (1 + 5) / 2)
    assert close(aggregate(x, mask, "seq-mean-token-sum-norm"), (4 / 4 + 5 / 4) / 2)


def test_aggregate_seq_mean_skips_empty_rows():
    x = torch.tensor([[2.0, 4.0], [9.0, 9.0]], dtype=F64)
    mask = torch.tensor([[1, 1], [0, 0]])
    assert close(aggregate(x, mask, "seq-mean-token-mean"), 3.0)
    assert close(aggregate(x, mask, "token-mean"), 3.0)


@pytest.mark.parametrize("mode", AGG_MODES)
def test_aggregate_denominator_gives_full_batch_under_micro_batching(mode):
    g = torch.Generator().manual_seed(4)
    B, T = 8, 6
    mask = rand_mask(B, T, g)
    x = torch.randn(B, T, generator=g, dtype=F64, requires_grad=True)
    full = aggregate(x, mask, mode)
    (g_full,) = torch.autograd.grad(full, x)
    if mode == "token-mean":
        den = mask.sum()
    elif mode == "seq-mean-token-mean":
        den = (mask.sum(1) > 0).sum()
    else:
        den = B
    total = 0
    for sl in (slice(0, 3), slice(3, 4), slice(4, 8)):  # uneven micro-batches
        total = total + aggregate(x[sl], mask[sl], mode, denominator=den, horizon=T)
    (g_acc,) = torch.autograd.grad(total, x)
    torch.testing.assert_close(total, full, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(g_acc, g_full, rtol=1e-12, atol=1e-12)
    # without the denominator, the sum of micro-batch means is NOT the full-batch loss
    naive = sum(aggregate(x[sl], mask[sl], mode) for sl in (slice(0, 3), slice(3, 4), slice(4, 8)))
    assert not close(naive, full, tol=1e-6)


def test_aggregate_denominator_as_float_and_tensor():
    x = torch.arange(6, dtype=F64).view(2, 3)
    mask = torch.ones(2, 3)
    assert close(aggregate(x, mask, denominator=10.0), 15 / 10)
    assert close(aggregate(x, mask, denominator=torch.tensor(10)), 15 / 10)


def test_aggregate_bad_input():
    x = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="agg"):
        aggregate(x, torch.ones(2, 3), "token-sum")
    with pytest.raises(ValueError, match="mask"):
        aggregate(x, torch.tensor([[1, 2, 1], [1, 1, 1]]), "token-mean")
    with pytest.raises(ValueError, match="mask"):
        aggregate(x, torch.ones(2, 4), "token-mean")


# ----------------------------------------------------------------------------- policy loss vs reference
@pytest.mark.parametrize(
    "eps_low, eps_high, dual",
    [(0.2, None, None), (0.2, 0.28, None), (0.1, None, 3.0), (0.2, 0.3, 2.0)],
)
@pytest.mark.parametrize("mode", AGG_MODES)
def test_policy_loss_matches_reference(eps_low, eps_high, dual, mode):
    logp, logp_old, adv, mask = policy_batch(seed=1, spread=0.6)
    logp = logp.clone().requires_grad_(True)
    loss, stats = policy_loss(
        logp, logp_old, adv, mask, clip_eps=eps_low, clip_eps_high=eps_high, dual_clip=dual, agg=mode
    )
    eh = eps_low if eps_high is None else eps_high
    per_tok, per_grad, clipped, duals = ref_policy_terms(logp, logp_old, adv, mask, eps_low, eh, dual)
    ref_loss = ref_aggregate(torch.tensor(per_tok, dtype=F64), mask, mode)
    assert loss.dtype == F64 and loss.dim() == 0
    assert close(loss, ref_loss)
    # the batch is diverse enough to exercise clipping
    n_clip = sum(map(sum, clipped))
    assert n_clip > 0
    # the gradient: for token-mean, d/dlogp = per-token derivative / n_valid
    loss.backward()
    if mode == "token-mean":
        n = int(mask.sum())
        expected = torch.tensor(per_grad, dtype=F64) / n
        torch.testing.assert_close(logp.grad, expected, rtol=1e-10, atol=1e-12)
    assert bool((logp.grad[~mask] == 0).all())
    # stats
    m = mask.bool()
    assert close(stats["clip_frac"], n_clip / int(m.sum()))
    assert close(stats["dual_clip_frac"], sum(map(sum, duals)) / int(m.sum()))
    d = (logp.detach() - logp_old).tolist()
    assert close(stats["approx_kl"], ref_token_mean([[0.5 * v * v for v in row] for row in d], mask))
    assert close(
        stats["approx_kl_k3"], ref_token_mean([[math.exp(v) - 1 - v for v in row] for row in d], mask)
    )
    ratios = [math.exp(d[i][t]) for i in range(len(d)) for t in range(len(d[0])) if m[i, t]]
    assert close(stats["ratio_max"], max(ratios))
    for v in stats.values():
        assert v.dim() == 0 and not v.requires_grad


def test_policy_loss_equals_minus_advantage_mean_at_ratio_one():
    logp, _, adv, mask = policy_batch(seed=2)
    logp = logp.clone().requires_grad_(True)
    loss, stats = policy_loss(logp, logp.detach().clone(), adv, mask)
    assert close(loss, -ref_token_mean(adv.tolist(), mask))
    assert float(stats["clip_frac"]) == 0.0 and close(stats["ratio_max"], 1.0)
    assert float(stats["approx_kl"]) == 0.0
    loss.backward()
    torch.testing.assert_close(logp.grad, -adv * mask / mask.sum(), rtol=1e-12, atol=1e-15)


# ----------------------------------------------------------------------------- clip behaviour
def one_token(ratio: float, a: float, **kw):
    logp = torch.tensor([[math.log(ratio)]], dtype=F64, requires_grad=True)
    loss, stats = policy_loss(
        logp, torch.zeros(1, 1, dtype=F64), torch.tensor([[a]], dtype=F64), torch.ones(1, 1), **kw
    )
    loss.backward()
    return loss.item(), logp.grad.item(), stats


def test_clip_positive_advantage_above_upper_bound():
    loss, grad, st_ = one_token(1.5, 2.0, clip_eps=0.2)
    assert close(loss, -2.0 * 1.2) and grad == 0.0 and float(st_["clip_frac"]) == 1.0


def test_clip_positive_advantage_below_lower_bound_is_not_clipped():
    loss, grad, st_ = one_token(0.5, 2.0, clip_eps=0.2)
    assert close(loss, -1.0) and close(grad, -2.0 * 0.5) and float(st_["clip_frac"]) == 0.0


def test_clip_negative_advantage_below_lower_bound():
    loss, grad, st_ = one_token(0.5, -2.0, clip_eps=0.2)
    assert close(loss, 2.0 * 0.8) and grad == 0.0 and float(st_["clip_frac"]) == 1.0


def test_clip_negative_advantage_above_upper_bound_is_not_clipped():
    loss, grad, st_ = one_token(1.5, -2.0, clip_eps=0.2)
    assert close(loss, 3.0) and close(grad, 3.0) and float(st_["clip_frac"]) == 0.0


def test_inside_trust_region_is_unclipped_for_both_signs():
    for a in (1.5, -1.5):
        loss, grad, st_ = one_token(1.1, a, clip_eps=0.2)
        assert close(loss, -a * 1.1) and close(grad, -a * 1.1) and float(st_["clip_frac"]) == 0.0


def test_zero_advantage_has_zero_loss_and_grad():
    loss, grad, _ = one_token(3.0, 0.0, clip_eps=0.2)
    assert loss == 0.0 and grad == 0.0


def test_clip_higher_uses_separate_upper_bound():
    # symmetric ε=0.2 clips ratio 1.25 for A>0 ...
    _, grad_sym, st_sym = one_token(1.25, 1.0, clip_eps=0.2)
    assert grad_sym == 0.0 and float(st_sym["clip_frac"]) == 1.0
    # ... clip-higher ε_high=0.28 lets it through
    loss, grad, st_ = one_token(1.25, 1.0, clip_eps=0.2, clip_eps_high=0.28)
    assert close(loss, -1.25) and close(grad, -1.25) and float(st_["clip_frac"]) == 0.0
    # beyond 1+ε_high it clips at 1.28
    loss, grad, _ = one_token(1.4, 1.0, clip_eps=0.2, clip_eps_high=0.28)
    assert close(loss, -1.28) and grad == 0.0
    # the lower bound is still 1−ε_low
    loss, grad, _ = one_token(0.7, -1.0, clip_eps=0.2, clip_eps_high=0.28)
    assert close(loss, 0.8) and grad == 0.0
    loss, grad, _ = one_token(0.75, -1.0, clip_eps=0.2, clip_eps_high=0.28)
    assert close(loss, 0.8) and grad == 0.0
    loss, grad, _ = one_token(0.85, -1.0, clip_eps=0.2, clip_eps_high=0.28)
    assert close(loss, 0.85) and close(grad, 0.85)


def test_dual_clip_bounds_negative_advantage_loss():
    c = 3.0
    # A<0 with large ratio: unclipped loss 5·|A| is bounded at c·|A|, zero gradient
    loss, grad, st_ = one_token(5.0, -2.0, clip_eps=0.2, dual_clip=c)
    assert close(loss, c * 2.0) and grad == 0.0
    assert float(st_["dual_clip_frac"]) == 1.0
    # without dual clip the same token gives loss 10 and a gradient
    loss_nd, grad_nd, st_nd = one_token(5.0, -2.0, clip_eps=0.2)
    assert close(loss_nd, 10.0) and close(grad_nd, 10.0) and float(st_nd["dual_clip_frac"]) == 0.0
    # below the bound it is inactive
    loss, grad, st_ = one_token(2.0, -2.0, clip_eps=0.2, dual_clip=c)
    assert close(loss, 4.0) and close(grad, 4.0) and float(st_["dual_clip_frac"]) == 0.0
    # positive advantages are not affected by the dual clip
    loss, grad, st_ = one_token(5.0, 2.0, clip_eps=0.2, dual_clip=c)
    assert close(loss, -2.0 * 1.2) and grad == 0.0 and float(st_["dual_clip_frac"]) == 0.0


def test_clip_frac_counts_only_valid_tokens():
    logp = torch.log(torch.tensor([[1.5, 1.0, 0.5, 9.0]], dtype=F64))
    adv = torch.tensor([[1.0, 1.0, -1.0, 1.0]], dtype=F64)
    mask = torch.tensor([[1, 1, 1, 0]])
    _, stats = policy_loss(logp, torch.zeros_like(logp), adv, mask, clip_eps=0.2)
    assert close(stats["clip_frac"], 2 / 3)
    assert close(stats["ratio_max"], 1.5)


# ----------------------------------------------------------------------------- gradient isolation
def test_policy_loss_gradient_isolation():
    logp, logp_old, adv, mask = policy_batch(seed=5)
    logp = garble(logp, mask).requires_grad_(True)
    logp_old = logp_old.clone().requires_grad_(True)
    adv = adv.clone().requires_grad_(True)
    loss, stats = policy_loss(logp, logp_old, adv, mask, clip_eps=0.2, dual_clip=3.0)
    loss.backward()
    assert logp_old.grad is None and adv.grad is None
    assert logp.grad is not None
    assert bool(torch.isfinite(logp.grad).all())
    assert bool((logp.grad[~mask] == 0).all())
    assert bool((logp.grad[mask] != 0).any())
    assert all(not v.requires_grad for v in stats.values())


def test_value_loss_gradient_isolation():
    g = torch.Generator().manual_seed(6)
    mask = rand_mask(5, 6, g)
    values = garble(torch.randn(5, 6, generator=g, dtype=F64), mask).requires_grad_(True)
    values_old = torch.randn(5, 6, generator=g, dtype=F64).requires_grad_(True)
    returns = torch.randn(5, 6, generator=g, dtype=F64).requires_grad_(True)
    for clip in (None, 0.2):
        values.grad = None
        loss, _ = value_loss(values, values_old, returns, mask, clip_eps=clip)
        loss.backward()
        assert values_old.grad is None and returns.grad is None
        assert values.grad is not None and bool(torch.isfinite(values.grad).all())
        assert bool((values.grad[~mask] == 0).all())
        assert bool((values.grad[mask] != 0).any())


def test_pg_loss_gradient_isolation_and_no_clipping():
    logp, logp_old, adv, mask = policy_batch(seed=7, spread=1.5)
    logp = logp.clone().requires_grad_(True)
    adv_r = adv.clone().requires_grad_(True)
    loss, stats = pg_loss(logp, logp_old, adv_r, mask, clip_eps=0.2, dual_clip=2.0)
    d = (logp.detach() - logp_old).tolist()
    ref = [[-adv[i, t].item() * math.exp(d[i][t]) for t in range(7)] for i in range(6)]
    assert close(loss, ref_token_mean(ref, mask))
    loss.backward()
    assert adv_r.grad is None
    n = mask.sum()
    torch.testing.assert_close(logp.grad, torch.tensor(ref, dtype=F64) * mask / n, rtol=1e-10, atol=1e-14)
    assert float(stats["clip_frac"]) == 0.0


def test_pg_loss_gradient_is_reinforce_at_ratio_one():
    logp, _, adv, mask = policy_batch(seed=8)
    logp = logp.clone().requires_grad_(True)
    loss, _ = pg_loss(logp, logp.detach(), adv, mask)
    loss.backward()
    torch.testing.assert_close(logp.grad, -adv * mask / mask.sum(), rtol=1e-12, atol=1e-15)


def test_policy_loss_registry():
    assert get_policy_loss("ppo") is policy_loss
    assert get_policy_loss("pg") is pg_loss
    with pytest.raises(ValueError, match="trpo"):
        get_policy_loss("trpo")


# ----------------------------------------------------------------------------- padding invariance
@pytest.mark.parametrize("mode", AGG_MODES)
def test_policy_loss_padding_invariance(mode):
    logp, logp_old, adv, mask = policy_batch(seed=9)
    clean, st_clean = policy_loss(logp, logp_old, adv, mask, clip_eps=0.2, dual_clip=3.0, agg=mode)
    dirty, st_dirty = policy_loss(
        garble(logp, mask),
        garble(logp_old, mask),
        garble(adv, mask),
        mask,
        clip_eps=0.2,
        dual_clip=3.0,
        agg=mode,
    )
    assert torch.equal(clean, dirty)
    for k in st_clean:
        assert torch.equal(st_clean[k], st_dirty[k]), k


@pytest.mark.parametrize("clip", [None, 0.2])
def test_value_loss_padding_invariance(clip):
    g = torch.Generator().manual_seed(10)
    mask = rand_mask(5, 6, g)
    v, vo, r = (torch.randn(5, 6, generator=g, dtype=F64) for _ in range(3))
    clean, s1 = value_loss(v, vo, r, mask, clip_eps=clip)
    dirty, s2 = value_loss(garble(v, mask), garble(vo, mask), garble(r, mask), mask, clip_eps=clip)
    assert torch.equal(clean, dirty) and torch.equal(s1["clip_frac"], s2["clip_frac"])


# ----------------------------------------------------------------------------- value loss
def ref_value_terms(v, vo, r, mask, clip):
    B, T = v.shape
    V, VO, R, m = v.tolist(), vo.tolist(), r.tolist(), mask.bool().tolist()
    loss = [[0.0] * T for _ in range(B)]
    grad = [[0.0] * T for _ in range(B)]
    n_clip = 0
    for i in range(B):
        for t in range(T):
            if not m[i][t]:
                continue
            e1 = (V[i][t] - R[i][t]) ** 2
            g = 2 * (V[i][t] - R[i][t])
            if clip is not None:
                vc = min(max(V[i][t], VO[i][t] - clip), VO[i][t] + clip)
                e2 = (vc - R[i][t]) ** 2
                if e2 > e1:
                    n_clip += 1
                    e1 = e2
                    inside = VO[i][t] - clip < V[i][t] < VO[i][t] + clip
                    g = 2 * (vc - R[i][t]) if inside else 0.0
            loss[i][t], grad[i][t] = e1, g
    return loss, grad, n_clip


@pytest.mark.parametrize("clip", [None, 0.2, 0.5])
@pytest.mark.parametrize("mode", AGG_MODES)
def test_value_loss_matches_reference(clip, mode):
    g = torch.Generator().manual_seed(11)
    mask = rand_mask(6, 7, g)
    vo = torch.randn(6, 7, generator=g, dtype=F64)
    v = (vo + 0.5 * torch.randn(6, 7, generator=g, dtype=F64)).requires_grad_(True)
    r = torch.randn(6, 7, generator=g, dtype=F64)
    loss, stats = value_loss(v, vo, r, mask, clip_eps=clip, agg=mode)
    per_tok, per_grad, n_clip = ref_value_terms(v, vo, r, mask, clip)
    assert close(loss, ref_aggregate(torch.tensor(per_tok, dtype=F64), mask, mode))
    assert close(stats["clip_frac"], n_clip / int(mask.sum()))
    if clip is not None:
        assert n_clip > 0
    loss.backward()
    if mode == "token-mean":
        expected = torch.tensor(per_grad, dtype=F64) / int(mask.sum())
        torch.testing.assert_close(v.grad, expected, rtol=1e-10, atol=1e-12)


def test_value_loss_has_no_half_factor():
    v = torch.tensor([[3.0]], dtype=F64, requires_grad=True)
    loss, _ = value_loss(
        v, torch.tensor([[3.0]], dtype=F64), torch.tensor([[1.0]], dtype=F64), torch.ones(1, 1)
    )
    assert close(loss, 4.0)
    loss.backward()
    assert close(v.grad, 4.0)


def test_value_loss_clipped_is_max_of_both_squared_errors():
    # V moved away from the target beyond the clip range: clipped error is smaller → max = unclipped.
    loss, st_ = value_loss(
        torch.tensor([[3.0]], dtype=F64),
        torch.tensor([[2.0]], dtype=F64),
        torch.tensor([[1.0]], dtype=F64),
        torch.ones(1, 1),
        clip_eps=0.2,
    )
    assert close(loss, 4.0) and float(st_["clip_frac"]) == 0.0
    # V moved toward (past) the target beyond the clip range: clipped error (1.8-1)²=0.64 > (0.5-1)²
    v = torch.tensor([[0.5]], dtype=F64, requires_grad=True)
    loss, st_ = value_loss(
        v, torch.tensor([[2.0]], dtype=F64), torch.tensor([[1.0]], dtype=F64), torch.ones(1, 1), clip_eps=0.2
    )
    assert close(loss, 0.64) and float(st_["clip_frac"]) == 1.0
    loss.backward()
    assert float(v.grad) == 0.0
    # inside the clip range both errors coincide
    loss, st_ = value_loss(
        torch.tensor([[2.1]], dtype=F64),
        torch.tensor([[2.0]], dtype=F64),
        torch.tensor([[1.0]], dtype=F64),
        torch.ones(1, 1),
        clip_eps=0.2,
    )
    assert close(loss, 1.21) and float(st_["clip_frac"]) == 0.0


def test_value_loss_micro_batch_denominator():
    g = torch.Generator().manual_seed(12)
    mask = rand_mask(6, 5, g)
    v = torch.randn(6, 5, generator=g, dtype=F64, requires_grad=True)
    vo, r = torch.randn(6, 5, generator=g, dtype=F64), torch.randn(6, 5, generator=g, dtype=F64)
    full, _ = value_loss(v, vo, r, mask, clip_eps=0.2)
    (g_full,) = torch.autograd.grad(full, v)
    acc = sum(
        value_loss(v[s], vo[s], r[s], mask[s], clip_eps=0.2, denominator=mask.sum())[0]
        for s in (slice(0, 2), slice(2, 6))
    )
    (g_acc,) = torch.autograd.grad(acc, v)
    torch.testing.assert_close(acc, full, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(g_acc, g_full, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("mode", AGG_MODES)
def test_policy_loss_micro_batch_denominator(mode):
    logp, logp_old, adv, mask = policy_batch(B=8, T=6, seed=13)
    logp = logp.clone().requires_grad_(True)
    full, _ = policy_loss(logp, logp_old, adv, mask, agg=mode)
    (g_full,) = torch.autograd.grad(full, logp)
    den = {
        "token-mean": mask.sum(),
        "seq-mean-token-mean": (mask.sum(1) > 0).sum(),
        "seq-mean-token-sum-norm": 8,
    }[mode]
    acc = sum(
        policy_loss(logp[s], logp_old[s], adv[s], mask[s], agg=mode, denominator=den, horizon=6)[0]
        for s in (slice(0, 5), slice(5, 8))
    )
    (g_acc,) = torch.autograd.grad(acc, logp)
    torch.testing.assert_close(acc, full, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(g_acc, g_full, rtol=1e-12, atol=1e-12)


# ----------------------------------------------------------------------------- bad input
def test_policy_loss_bad_input():
    logp, logp_old, adv, mask = policy_batch(B=2, T=3, seed=14)
    with pytest.raises(ValueError, match="logp_old"):
        policy_loss(logp, logp_old[:, :2], adv, mask)
    with pytest.raises(ValueError, match="advantages"):
        policy_loss(logp, logp_old, adv[:1], mask)
    with pytest.raises(ValueError, match="mask"):
        policy_loss(logp, logp_old, adv, torch.tensor([[1, 0, 3], [1, 1, 0]]))
    for eps in (0.0, -0.1):
        with pytest.raises(ValueError, match="clip_eps"):
            policy_loss(logp, logp_old, adv, mask, clip_eps=eps)
    with pytest.raises(ValueError, match="clip_eps_high"):
        policy_loss(logp, logp_old, adv, mask, clip_eps_high=0.0)
    for c in (1.0, 0.5, -2.0):
        with pytest.raises(ValueError, match="dual_clip"):
            policy_loss(logp, logp_old, adv, mask, dual_clip=c)
    with pytest.raises(ValueError, match="agg"):
        policy_loss(logp, logp_old, adv, mask, agg="sum")
    with pytest.raises(ValueError, match="agg"):
        pg_loss(logp, logp_old, adv, mask, agg="sum")
    with pytest.raises(ValueError, match="advantages"):
        pg_loss(logp, logp_old, adv[:, :1], mask)


def test_value_loss_bad_input():
    v = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="returns"):
        value_loss(v, v, torch.zeros(2, 4), torch.ones(2, 3))
    with pytest.raises(ValueError, match="values_old"):
        value_loss(v, torch.zeros(3, 3), v, torch.ones(2, 3))
    with pytest.raises(ValueError, match="mask"):
        value_loss(v, v, v, torch.tensor([[0, -1, 1], [1, 1, 1]]))
    for eps in (0.0, -1.0):
        with pytest.raises(ValueError, match="clip_eps"):
            value_loss(v, v, v, torch.ones(2, 3), clip_eps=eps)
    with pytest.raises(ValueError, match="agg"):
        value_loss(v, v, v, torch.ones(2, 3), agg="max")


# ----------------------------------------------------------------------------- entropy
def test_entropy_from_logits_matches_loop():
    g = torch.Generator().manual_seed(15)
    logits = 3 * torch.randn(2, 3, 5, generator=g, dtype=F64)
    h = entropy_from_logits(logits)
    assert h.shape == (2, 3) and h.dtype == F64
    for i in range(2):
        for t in range(3):
            row = logits[i, t].tolist()
            z = sum(math.exp(x) for x in row)
            p = [math.exp(x) / z for x in row]
            assert close(h[i, t], -sum(q * math.log(q) for q in p))


def test_entropy_bounds_and_half_precision():
    uniform = torch.zeros(4, 7)
    torch.testing.assert_close(entropy_from_logits(uniform), torch.full((4,), math.log(7)))
    peaked = torch.tensor([[100.0, 0.0, 0.0]])
    assert float(entropy_from_logits(peaked)) < 1e-30 + 1e-6
    h16 = entropy_from_logits(torch.zeros(2, 7, dtype=torch.bfloat16))
    assert h16.dtype == torch.float32
    torch.testing.assert_close(h16, torch.full((2,), math.log(7)))


def test_entropy_with_masked_vocab_entries():
    # -inf logits (zero-probability tokens) contribute 0 to the entropy, and gradients stay finite.
    logits = torch.tensor([[0.0, float("-inf"), math.log(3.0)]], dtype=F64, requires_grad=True)
    h = entropy_from_logits(logits)
    p = [0.25, 0.75]
    assert close(h, -sum(q * math.log(q) for q in p))
    h.sum().backward()
    assert bool(torch.isfinite(logits.grad).all())


def test_entropy_gradient_matches_analytic():
    g = torch.Generator().manual_seed(16)
    logits = torch.randn(3, 6, generator=g, dtype=F64, requires_grad=True)
    entropy_from_logits(logits).sum().backward()
    p = torch.softmax(logits.detach(), -1)
    logp = torch.log_softmax(logits.detach(), -1)
    h = -(p * logp).sum(-1, keepdim=True)
    torch.testing.assert_close(logits.grad, -p * (logp + h), rtol=1e-10, atol=1e-12)


# ----------------------------------------------------------------------------- explained variance
def ref_explained_variance(values, returns, mask):
    m = mask.bool().tolist()
    R = [returns[i, t].item() for i in range(len(m)) for t in range(len(m[0])) if m[i][t]]
    D = [
        returns[i, t].item() - values[i, t].item() for i in range(len(m)) for t in range(len(m[0])) if m[i][t]
    ]

    def var(xs):
        mu = sum(xs) / len(xs)
        return sum((x - mu) ** 2 for x in xs) / len(xs)

    return 1 - var(D) / var(R)


def test_explained_variance_matches_formula_and_padding():
    g = torch.Generator().manual_seed(17)
    mask = rand_mask(5, 6, g)
    r = torch.randn(5, 6, generator=g, dtype=F64)
    v = r + 0.4 * torch.randn(5, 6, generator=g, dtype=F64)
    ev = explained_variance(v, r, mask)
    assert ev.dim() == 0 and ev.dtype == F64
    assert close(ev, ref_explained_variance(v, r, mask))
    assert torch.equal(explained_variance(garble(v, mask), garble(r, mask), mask), ev)


def test_explained_variance_identities():
    g = torch.Generator().manual_seed(18)
    mask = rand_mask(4, 5, g)
    r = torch.randn(4, 5, generator=g, dtype=F64)
    assert close(explained_variance(r.clone(), r, mask), 1.0)
    # a constant critic explains nothing; a constant offset still explains everything
    assert close(explained_variance(torch.full_like(r, 0.3), r, mask), 0.0)
    assert close(explained_variance(r + 2.0, r, mask), 1.0)
    # values uncorrelated and with the same variance → 1 − 2 ... negative
    assert float(explained_variance(-r, r, mask)) < 0
    # constant returns → NaN (undefined)
    assert math.isnan(float(explained_variance(r, torch.ones_like(r), mask)))


def test_explained_variance_bad_input():
    with pytest.raises(ValueError, match="returns"):
        explained_variance(torch.zeros(2, 3), torch.zeros(2, 2), torch.ones(2, 3))
    with pytest.raises(ValueError, match="mask"):
        explained_variance(torch.zeros(2, 3), torch.zeros(2, 3), torch.tensor([[0, 2, 0], [1, 1, 1]]))


# ----------------------------------------------------------------------------- property tests
@settings(max_examples=40, deadline=None)
@given(
    B=st.integers(1, 5),
    T=st.integers(1, 6),
    seed=st.integers(0, 2**31 - 1),
    eps=st.floats(0.05, 0.5),
    eps_high=st.one_of(st.none(), st.floats(0.05, 0.5)),
    dual=st.one_of(st.none(), st.floats(1.5, 5.0)),
)
def test_policy_loss_property(B, T, seed, eps, eps_high, dual):
    logp, logp_old, adv, mask = policy_batch(B, T, seed, spread=0.8)
    logp = logp.clone().requires_grad_(True)
    loss, stats = policy_loss(logp, logp_old, adv, mask, clip_eps=eps, clip_eps_high=eps_high, dual_clip=dual)
    eh = eps if eps_high is None else eps_high
    per_tok, per_grad, clipped, _ = ref_policy_terms(logp, logp_old, adv, mask, eps, eh, dual)
    assert close(loss, ref_token_mean(per_tok, mask), tol=1e-9)
    loss.backward()
    expected = torch.tensor(per_grad, dtype=F64) / int(mask.sum())
    torch.testing.assert_close(logp.grad, expected, rtol=1e-9, atol=1e-12)
    assert 0.0 <= float(stats["clip_frac"]) <= 1.0
    # pessimism: the clipped objective is never better than the unclipped surrogate
    d = logp.detach() - logp_old
    unclipped = ref_token_mean((-adv * d.exp()).tolist(), mask)
    if dual is None:
        assert loss.item() >= unclipped - 1e-9


def test_approx_kl_k3_estimates_kl_old_new_from_old_samples():
    """Tokens are drawn from π_old, so k3 must average to KL(π_old ‖ π_θ) (and k2 approximately so);
    the mirrored (e^{−d} − 1) + d would estimate neither."""
    g = torch.Generator().manual_seed(0)
    # π_θ has moved its mass off π_old's favourite token: here the mirrored form averages 1.30, KL is 0.57
    lp_old = torch.tensor([2.0, 0, 0, 0, 0, 0, 0, 0], dtype=F64).log_softmax(-1)
    lp_new = torch.tensor([0.0, 1, 0, 0, 0, 0, 0, 0], dtype=F64).log_softmax(-1)
    exact = float((lp_old.exp() * (lp_old - lp_new)).sum())
    tokens = torch.multinomial(lp_old.exp(), 200_000, replacement=True, generator=g).view(400, 500)
    logp, logp_old = lp_new[tokens], lp_old[tokens]
    mask = torch.ones_like(logp, dtype=torch.bool)
    _, stats = policy_loss(logp, logp_old, torch.zeros_like(logp), mask)
    assert abs(float(stats["approx_kl_k3"]) - exact) < 0.01 * exact
    _, stats_pg = pg_loss(logp, logp_old, torch.zeros_like(logp), mask)
    assert float(stats_pg["approx_kl_k3"]) == pytest.approx(float(stats["approx_kl_k3"]))
