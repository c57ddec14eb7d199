"""The PPO objective as a pure function, the KL loss term (masking, clamp, what its gradient is), and
the statistics aggregator — against hand-computed values and closed forms."""

from __future__ import annotations

import math

import pytest
import torch

from ppo_lm.algorithms import (
    ObjectiveSettings,
    StatsAggregator,
    UpdateStats,
    assume_valid_masks,
    check_response_mask,
    kl_loss_per_token,
    loss_units,
    ppo_objective,
)

F64 = torch.float64


def _batch():
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]], dtype=torch.bool)
    logp = torch.tensor([[-1.0, -0.5, -2.0], [-0.2, -1.5, -9.0]], dtype=F64)
    logp_old = torch.tensor([[-1.1, -0.9, -1.0], [-0.3, -1.4, 0.0]], dtype=F64)
    logp_ref = torch.tensor([[-1.2, -0.4, -1.5], [-0.1, -1.0, 0.0]], dtype=F64)
    adv = torch.tensor([[0.5, -1.0, 2.0], [-0.3, 1.2, 0.0]], dtype=F64)
    entropy = torch.tensor([[1.0, 0.8, 0.5], [1.5, 0.2, 7.0]], dtype=F64)
    values = torch.tensor([[0.1, 0.4, 0.9], [0.0, -0.5, 3.0]], dtype=F64)
    values_old = torch.tensor([[0.0, 0.2, 1.0], [0.3, -0.2, 0.0]], dtype=F64)
    returns = torch.tensor([[0.5, 0.5, 1.0], [0.0, 0.0, 0.0]], dtype=F64)
    return mask, logp, logp_old, logp_ref, adv, entropy, values, values_old, returns


def _hand_objective(s: ObjectiveSettings):
    """The objective written out token by token (token-mean over the 5 valid tokens)."""
    mask, logp, logp_old, logp_ref, adv, entropy, values, values_old, returns = (t.tolist() for t in _batch())
    valid = [(i, t) for i in range(2) for t in range(3) if mask[i][t]]
    n = len(valid)
    pol = kl = ent = val = 0.0
    for i, t in valid:
        r = math.exp(logp[i][t] - logp_old[i][t])
        a = adv[i][t]
        pol += max(-a * r, -a * min(max(r, 1 - s.clip_eps), 1 + s.clip_eps)) / n
        d = logp[i][t] - logp_ref[i][t]
        kl += min((math.exp(-d) - 1) + d, s.kl_clamp) / n
        ent += entropy[i][t] / n
        v, vo, ret = values[i][t], values_old[i][t], returns[i][t]
        vc = vo + min(max(v - vo, -s.value_clip_eps), s.value_clip_eps)
        val += max((v - ret) ** 2, (vc - ret) ** 2) / n
    return pol, kl, ent, val


def test_objective_equals_the_sum_of_its_terms_by_hand():
    s = ObjectiveSettings(clip_eps=0.2, kl_coef=0.3, kl_estimator="k3", kl_clamp=0.05, entropy_coef=0.01,
                          vf_coef=0.5, value_clip_eps=0.2)
    mask, logp, logp_old, logp_ref, adv, entropy, values, values_old, returns = _batch()
    loss, stats = ppo_objective(mask, s, logp=logp, logp_old=logp_old, advantages=adv, logp_ref=logp_ref,
                                entropy=entropy, values=values, values_old=values_old, returns=returns)
    pol, kl, ent, val = _hand_objective(s)
    n = float(mask.sum())  # the objective is a sum over loss units (tokens): ÷ n is the mean
    assert float(loss) / n == pytest.approx(pol + 0.3 * kl - 0.01 * ent + 0.5 * val, abs=1e-12)
    assert float(stats.policy_loss) == pytest.approx(pol, abs=1e-12)
    assert float(stats.kl_loss) == pytest.approx(kl, abs=1e-12)
    assert float(stats.value_loss) == pytest.approx(val, abs=1e-12)
    assert float(stats.entropy) == pytest.approx(ent, abs=1e-12)
    assert float(stats.kl_clamp_frac) > 0  # the small clamp cut some tokens
    assert stats.grad_norm_actor is None  # not the objective's


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_objective_sums_over_loss_units_so_shares_add_up_to_the_minibatch(agg):
    """The loss is a sum over loss units: the rows' sums, divided by the whole minibatch's count, add up
    to the minibatch's mean loss (what the update's micro-batches and lanes rely on); the statistics
    are each call's own means."""
    s = ObjectiveSettings(vf_coef=1.0, value_clip_eps=None, kl_coef=0.2, loss_agg=agg, horizon=3.0)
    mask, logp, logp_old, logp_ref, adv, _, values, values_old, returns = _batch()
    kw = dict(logp=logp, logp_old=logp_old, advantages=adv, logp_ref=logp_ref, values=values,
              values_old=values_old, returns=returns)
    whole, st_whole = ppo_objective(mask, s, **kw)
    count = loss_units(mask, agg)
    parts = [ppo_objective(mask[i : i + 1], s, **{k: v[i : i + 1] for k, v in kw.items()}) for i in range(2)]
    assert float(sum(p[0] for p in parts)) == pytest.approx(float(whole), abs=1e-12)
    units0 = loss_units(mask[:1], agg)
    assert float(parts[0][1].value_loss) * units0 + float(parts[1][1].value_loss) * loss_units(mask[1:], agg) == \
        pytest.approx(float(st_whole.value_loss) * count, abs=1e-12)


def test_objective_terms_follow_their_inputs():
    s = ObjectiveSettings(vf_coef=0.25, value_clip_eps=0.2)
    mask, logp, logp_old, _, adv, entropy, values, values_old, returns = _batch()
    critic_only, st = ppo_objective(mask, s, values=values, values_old=values_old, returns=returns)
    assert float(critic_only) / float(mask.sum()) == pytest.approx(0.25 * _hand_objective(ObjectiveSettings(kl_clamp=1.0, value_clip_eps=0.2))[3], abs=1e-12)
    assert st.policy_loss is None and st.ratio_max is None and st.value_loss is not None
    policy_only, st = ppo_objective(mask, s, logp=logp, logp_old=logp_old, advantages=adv, entropy=entropy)
    assert st.value_loss is None and st.kl_loss is None and st.entropy is not None
    # entropy_coef 0: the entropy is a statistic, not a term
    assert float(policy_only) / float(mask.sum()) == pytest.approx(float(st.policy_loss), abs=1e-12)


def test_kl_loss_masks_pads_before_the_estimator():
    """A pad whose log-prob is below ≈ −88.7 overflows k3's e^{−d} in fp32: masking after the
    estimator gives 0·inf = NaN gradients, masking first keeps them finite."""
    mask = torch.tensor([[True, True, False]])
    logp = torch.tensor([[-1.0, -2.0, -200.0]], requires_grad=True)
    logp_ref = torch.tensor([[-1.5, -1.0, 0.0]])
    kl, _ = kl_loss_per_token(logp, logp_ref, mask, "k3", clamp=None)
    kl.sum().backward()
    assert torch.isfinite(logp.grad).all() and logp.grad[0, 2] == 0
    from ppo_lm.algorithms import kl_penalty  # what masking afterwards does

    logp.grad = None
    kl_penalty(logp, logp_ref, "k3").where(mask, 0).sum().backward()
    assert not torch.isfinite(logp.grad).all()


def test_kl_clamp_bounds_the_term_and_its_gradient():
    mask = torch.ones(1, 3, dtype=torch.bool)
    logp = torch.tensor([[-31.0, -1.0, -1.2]], dtype=F64, requires_grad=True)
    logp_ref = torch.tensor([[-1.0, -1.1, -1.0]], dtype=F64)
    raw, clamped = kl_loss_per_token(logp, logp_ref, mask, "k3", clamp=None)
    assert float(raw[0, 0].detach()) == pytest.approx(math.exp(30) - 1 - 30)  # ≈ 1.07e13
    assert not clamped.any()
    kl, clamped = kl_loss_per_token(logp, logp_ref, mask, "k3", clamp=10.0)
    assert float(kl[0, 0]) == 10.0 and clamped.tolist() == [[True, False, False]]
    torch.testing.assert_close(kl[0, 1:], raw[0, 1:])
    kl.sum().backward()
    assert logp.grad[0, 0] == 0 and (logp.grad[0, 1:] != 0).all()
    _, stats = ppo_objective(mask, ObjectiveSettings(kl_coef=0.1, kl_clamp=10.0), logp=logp.detach(),
                             logp_old=logp.detach(), advantages=torch.zeros(1, 3, dtype=F64), logp_ref=logp_ref)
    assert float(stats.kl_clamp_frac) == pytest.approx(1 / 3)


@pytest.mark.parametrize("kind", ["k1", "k2", "k3"])
def test_expected_gradient_of_each_kl_estimator_as_a_loss(kind):
    """On-policy, with the sampled tokens' probabilities as weights (the expectation is exact on a
    small categorical): k1's expected gradient is 0, k2's that of KL(π‖π_ref), k3's that of the
    forward KL(π_ref‖π) — docs/algorithm.md §1.4."""
    g = torch.Generator().manual_seed(3)
    theta = torch.randn(6, generator=g, dtype=F64, requires_grad=True)
    log_ref = torch.log_softmax(torch.randn(6, generator=g, dtype=F64), -1)
    logp = torch.log_softmax(theta, -1)
    kl, _ = kl_loss_per_token(logp[None], log_ref[None], torch.ones(1, 6, dtype=torch.bool), kind, clamp=None)
    expected_loss = (logp.detach().exp() * kl[0]).sum()  # E_{y~π}[k(y)], π held fixed as the sampler
    (grad,) = torch.autograd.grad(expected_loss, theta, retain_graph=True)
    p, ref = logp.exp(), log_ref.exp()
    if kind == "k1":
        target = torch.zeros(6, dtype=F64)
    elif kind == "k2":
        (target,) = torch.autograd.grad((p * (logp - log_ref)).sum(), theta, retain_graph=True)
    else:
        (target,) = torch.autograd.grad((ref * (log_ref - logp)).sum(), theta, retain_graph=True)
    torch.testing.assert_close(grad, target, rtol=1e-10, atol=1e-12)
    if kind == "k3":  # and it is not the reverse KL's gradient
        (reverse,) = torch.autograd.grad((p * (logp - log_ref)).sum(), theta)
        assert (grad - reverse).abs().max() > 1e-3


def test_aggregator_weighs_by_units_tokens_and_steps():
    agg = StatsAggregator()
    agg.add(UpdateStats(policy_loss=1.0, approx_kl=0.1, ratio_max=1.3), units=2.0, tokens=10.0)
    agg.add(UpdateStats(policy_loss=3.0, approx_kl=0.4, ratio_max=1.1), units=6.0, tokens=30.0)
    agg.add(UpdateStats(grad_norm_actor=2.0))
    agg.add(UpdateStats(grad_norm_actor=4.0))
    r = agg.result()
    assert r.policy_loss == pytest.approx((1 * 2 + 3 * 6) / 8)
    assert r.approx_kl == pytest.approx((0.1 * 10 + 0.4 * 30) / 40)
    assert r.ratio_max == 1.3 and r.grad_norm_actor == pytest.approx(3.0)
    assert r.value_loss is None and "value_loss" not in r.as_dict()


def test_aggregator_over_ranks_equals_one_aggregator_over_all():
    parts = [(UpdateStats(value_loss=v, entropy=e, ratio_max=m), u, t)
             for v, e, m, u, t in [(0.5, 1.0, 1.2, 3, 7), (0.1, 2.0, 1.5, 1, 2), (0.9, 0.5, 1.0, 4, 4)]]
    whole = StatsAggregator()
    ranks = [StatsAggregator(), StatsAggregator()]
    for i, (s, u, t) in enumerate(parts):
        whole.add(s, units=u, tokens=t)
        ranks[min(i, 1)].add(s, units=u, tokens=t)
    # all-reduce over two "ranks": each reduces its own tensor with the other's
    own = {}

    def fake(op):
        def reduce(t):
            key = (op, tuple(t.shape))
            if key not in own:
                own[key] = t
                return t
            return own.pop(key).__getattribute__(op)(t) if op == "add" else torch.maximum(own.pop(key), t)
        return reduce

    ranks[0].result(all_reduce_sum=fake("add"), all_reduce_max=fake("max"))
    combined = ranks[1].result(all_reduce_sum=fake("add"), all_reduce_max=fake("max"))
    assert combined.as_dict() == pytest.approx(whole.result().as_dict())
    merged = StatsAggregator()
    merged.merge(ranks[0])
    merged.merge(ranks[1])
    assert merged.result().as_dict() == pytest.approx(whole.result().as_dict())


def test_value_checks_run_once_at_the_boundary():
    bad = torch.tensor([[1, 0, 1]], dtype=torch.bool)
    with pytest.raises(ValueError, match="right-padded"):
        check_response_mask(bad)
    with pytest.raises(ValueError, match="at least one valid token"):
        check_response_mask(torch.tensor([[1, 1], [0, 0]], dtype=torch.bool))
    x = torch.zeros(1, 3)
    not_01 = torch.tensor([[1, 2, 0]])
    with pytest.raises(ValueError, match="only 0 and 1"):
        ppo_objective(not_01, ObjectiveSettings(), logp=x, logp_old=x, advantages=x)
    with assume_valid_masks():  # the trainer's hot path: no host sync for the mask's values
        ppo_objective(not_01, ObjectiveSettings(), logp=x, logp_old=x, advantages=x)
        with pytest.raises(ValueError, match="right-padded"):
            check_response_mask(bad)  # the boundary check itself always runs
    with pytest.raises(ValueError, match="only 0 and 1"):  # and the checks are back afterwards
        ppo_objective(not_01, ObjectiveSettings(), logp=x, logp_old=x, advantages=x)
    ppo_objective(bad, ObjectiveSettings(), logp=x, logp_old=x, advantages=x)  # holes: masked sums take them
