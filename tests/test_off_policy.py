"""Off-policy corrections (algorithms/off_policy.py, docs/algorithm.md §1.6) against naive per-token
loops on random masked batches; the weights reach the policy loss as a per-token factor; with the
behaviour policy equal to the proximal one every correction is the identity; the trainer applies
the one `algo.off_policy_correction` names and reports its statistics."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from trainer_helpers import count_sevens, tiny_config

from ppo_lm.algorithms import policy_loss
from ppo_lm.algorithms.off_policy import OFF_POLICY_CORRECTIONS, CorrectionSettings, off_policy_weights
from ppo_lm.trainer.ppo import PPOTrainer


def _batch(seed: int, B: int = 5, T: int = 7, spread: float = 0.8):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, T + 1, (B,), generator=g)
    mask = torch.arange(T).unsqueeze(0) < lengths.unsqueeze(1)
    mask[:, 1::3] &= torch.rand(B, T // 3 + (T % 3 > 1), generator=g)[:, : mask[:, 1::3].shape[1]] > 0.3  # holes
    behav = -torch.rand(B, T, generator=g) * 3
    prox = behav + torch.randn(B, T, generator=g) * spread
    return prox, behav, mask


def _naive(prox, behav, mask, name, s: CorrectionSettings):
    B, T = mask.shape
    out = torch.zeros(B, T, dtype=torch.double)
    for i in range(B):
        tokens = [t for t in range(T) if mask[i, t]]
        logs = [float(prox[i, t]) - float(behav[i, t]) for t in tokens]
        geo = math.exp(sum(logs) / len(logs)) if logs else 1.0
        for t, lw in zip(tokens, logs):
            w = math.exp(lw)
            out[i, t] = {"decoupled": w, "tis": min(w, s.cap), "token-mask": float(s.low <= w <= s.high),
                         "sequence-mask": float(s.low <= geo <= s.high)}[name]
    return out


@pytest.mark.parametrize("name", sorted(OFF_POLICY_CORRECTIONS))
def test_each_correction_matches_a_naive_loop(name):
    s = CorrectionSettings(cap=1.5, low=0.7, high=1.4)
    for seed in range(30):
        prox, behav, mask = _batch(seed)
        got, stats = off_policy_weights(prox, behav, mask, name, s)
        want = _naive(prox, behav, mask, name, s)
        assert torch.allclose(got.double(), want, rtol=1e-5, atol=1e-6), seed
        assert not got[~mask].any()
        n = int(mask.sum())
        if n:
            ws = [math.exp(float(prox[i, t] - behav[i, t])) for i, t in mask.nonzero().tolist()]
            assert float(stats["is_weight_mean"]) == pytest.approx(sum(ws) / n, rel=1e-5)
            assert float(stats["is_weight_max"]) == pytest.approx(max(ws), rel=1e-5)
            assert float(stats["kl_behav_prox"]) == pytest.approx(sum(w - 1 - math.log(w) for w in ws) / n,
                                                                 rel=1e-4, abs=1e-7)
            cut = {"decoupled": 0, "tis": sum(w > s.cap for w in ws)}.get(name, int((want[mask] == 0).sum()))
            assert float(stats["off_policy_cut_frac"]) == pytest.approx(cut / n)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), name=st.sampled_from(sorted(OFF_POLICY_CORRECTIONS)))
def test_the_same_policy_needs_no_correction(seed, name):
    _, behav, mask = _batch(seed)
    c, stats = off_policy_weights(behav.clone(), behav, mask, name)
    assert torch.equal(c, mask.to(c.dtype))
    assert float(stats["off_policy_cut_frac"]) == 0 and float(stats["kl_behav_prox"]) == 0


def test_the_weights_scale_each_tokens_surrogate():
    prox, behav, mask = _batch(3, B=6, T=9)
    g = torch.Generator().manual_seed(1)
    logp = (prox + 0.3 * torch.randn(prox.shape, generator=g)).requires_grad_()
    adv = torch.randn(prox.shape, generator=g)
    c, _ = off_policy_weights(prox, behav, mask, "tis")
    loss, _ = policy_loss(logp, prox, adv, mask, clip_eps=0.2, weights=c)
    want = 0.0
    for i, t in mask.nonzero().tolist():
        r = math.exp(float(logp[i, t].detach() - prox[i, t]))
        a = float(adv[i, t])
        want += float(c[i, t]) * max(-a * r, -a * min(max(r, 0.8), 1.2))
    assert float(loss.detach()) == pytest.approx(want / int(mask.sum()), rel=1e-5)
    unweighted, _ = policy_loss(logp, prox, adv, mask, clip_eps=0.2, weights=torch.ones_like(c))
    assert torch.equal(unweighted, policy_loss(logp, prox, adv, mask, clip_eps=0.2)[0])


def test_a_bad_band_or_name_is_refused():
    prox, behav, mask = _batch(0)
    with pytest.raises(ValueError, match="band"):
        off_policy_weights(prox, behav, mask, "token-mask", CorrectionSettings(low=1.2, high=2.0))
    with pytest.raises(ValueError, match="unknown off-policy correction"):
        off_policy_weights(prox, behav, mask, "ips")


def test_the_trainer_applies_the_correction_it_names(tmp_path):
    """On policy the sampler and the scoring forward agree to rounding: weights ≈ 1, nothing cut, and the
    run trains; a mask band narrower than the rounding cuts every token and the policy does not move."""
    kw = dict(iterations=1, rollout__num_prompts=8, rollout__max_new_tokens=6, optim__epochs=1)
    tr = PPOTrainer(tiny_config(tmp_path / "a", algo__off_policy_correction="decoupled", **kw), verifier=count_sevens)
    m = tr.train_iteration(1).metrics
    assert abs(m["is_weight_mean"] - 1) < 1e-4 and m["is_weight_max"] < 1.001 and m["off_policy_cut_frac"] == 0
    assert 0 <= m["kl_behav_prox"] < 1e-6
    tight = tiny_config(tmp_path / "b", algo__off_policy_correction="sequence-mask", algo__is_band_low=1.0,
                        algo__is_band_high=1.0, **kw)
    tr = PPOTrainer(tight, verifier=count_sevens)
    before = {k: v.detach().clone() for k, v in tr.policy.named_parameters()}
    batch = tr.rollout(1)
    exact = torch.equal(batch.logp_old.where(batch.response_mask, 0), batch.logp_behaviour.where(batch.response_mask, 0))
    m = tr.learn(batch, 1).metrics
    if not exact:  # rounding differs somewhere in every response: every response is masked
        assert m["off_policy_cut_frac"] > 0
    if m["off_policy_cut_frac"] == 1:
        moved = [k for k, v in tr.policy.named_parameters() if "value_head" not in k and not torch.equal(v, before[k])]
        assert not moved, moved[:3]


def test_a_correction_with_the_samplers_logp_is_refused(tmp_path):
    from ppo_lm.runtime.errors import ConfigError

    cfg = tiny_config(tmp_path, algo__off_policy_correction="tis", rollout__logp_from_sampler=True)
    with pytest.raises(ConfigError, match="every weight is 1"):
        PPOTrainer(cfg, verifier=count_sevens)


def test_none_chosen_leaves_every_weight_at_one_and_says_what_the_lag_did():
    for seed in range(10):
        prox, behav, mask = _batch(seed)
        c, stats = off_policy_weights(prox, behav, mask, "none")
        _, decoupled = off_policy_weights(prox, behav, mask, "decoupled")
        assert torch.equal(c, mask.to(c.dtype))
        assert {k: float(v) for k, v in stats.items()} == {k: float(v) for k, v in decoupled.items()}


def test_a_stale_run_with_none_chosen_logs_the_ratios_it_does_not_correct(tmp_path):
    cfg = tiny_config(tmp_path, iterations=3, rollout__max_staleness=1, algo__off_policy_correction="none",
                      rollout__num_prompts=8, rollout__max_new_tokens=6, optim__critic_warmup_iterations=0)
    history = PPOTrainer(cfg, verifier=count_sevens).train()
    assert history[-1]["staleness_max"] == 1 and history[-1]["is_weight_max"] != 1
    assert all(m["off_policy_cut_frac"] == 0 for m in history)
