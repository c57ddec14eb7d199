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
from ppo_lm.algorithms.off_policy import (
    OFF_POLICY_CORRECTIONS,
    CorrectionSettings,
    off_policy_weights,
    resolve_correction,
)
from ppo_lm.trainer.ppo import PPOTrainer


def _batch(seed: int, B: int = 5, T: int = 7, spread: float = 0.8):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, T + 1, (B,), generator=g)
    mask = torch.arange(T).unsqueeze(0) < lengths.unsqueeze(1)
    mask[:, 1::3] &= torch.rand(B, T // 3 + (T % 3 > 1), generator=g)[:, : mask[:, 1::3].shape[1]] > 0.3  # holes
    behav = -torch.rand(B, T, generator=g) * 3
    prox = behav + torch.randn(B, T, generator=g) * spread
    return prox, behav, mask


# the references' own rules, token by token: (weight, kept?) of token t given w_t and its response's ratios
def _reference(name: str, w: float, ws: list[float], s: CorrectionSettings) -> tuple[float, bool]:
    seq = math.prod(ws)
    geo = math.exp(sum(map(math.log, ws)) / len(ws))
    return {
        "decoupled": (w, w <= s.cap),  # AReaL: behav_imp_weight_cap zeroes tokens above the cap
        "tis": (min(w, s.cap), True),
        "token-mask": (w, s.low <= w <= s.high),  # IcePop: w kept inside [α, β], 0 outside
        "sequence-tis": (min(seq, s.cap), True),  # verl rollout_is "sequence": the capped product
        "sequence-mask": (1.0, s.low <= geo <= s.high),  # verl rollout_rs "geometric"
        "none": (1.0, True),
    }[name]


def _naive(prox, behav, mask, name, s: CorrectionSettings, band: str | None = None):
    """The weights by a loop over responses and tokens; ``band``: a mask part in place of the correction's own."""
    B, T = mask.shape
    out = torch.zeros(B, T, dtype=torch.double)
    for i in range(B):
        tokens = [t for t in range(T) if mask[i, t]]
        ws = [math.exp(float(prox[i, t]) - float(behav[i, t])) for t in tokens]
        vetoed = s.veto is not None and any(w < s.veto for w in ws)
        for t, w in zip(tokens, ws):
            weight, kept = _reference(name, w, ws, s)
            if band == "token-band":
                kept = s.low <= w <= s.high
            elif band == "token-cap":
                kept = w <= s.cap
            elif band == "none":
                kept = True
            out[i, t] = weight if kept and not vetoed else 0.0
    return out


NAMES = sorted(OFF_POLICY_CORRECTIONS) + ["none"]


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("veto", [None, 0.5])
def test_each_correction_matches_a_naive_loop(name, veto):
    s = CorrectionSettings(cap=1.5, low=0.7, high=1.4, veto=veto)
    for seed in range(30):
        prox, behav, mask = _batch(seed)
        got, sums = off_policy_weights(prox, behav, mask, name, s)
        want = _naive(prox, behav, mask, name, s)
        assert torch.allclose(got.double(), want, rtol=1e-5, atol=1e-6), seed
        assert not got[~mask].any()
        stats = sums.metrics()
        n = int(mask.sum())
        if n:
            ws = [math.exp(float(prox[i, t] - behav[i, t])) for i, t in mask.nonzero().tolist()]
            assert stats["is_weight_mean"] == pytest.approx(sum(ws) / n, rel=1e-5)
            assert stats["is_weight_max"] == pytest.approx(max(ws), rel=1e-5)
            assert stats["kl_behav_prox"] == pytest.approx(sum(w - 1 - math.log(w) for w in ws) / n, rel=1e-4, abs=1e-7)
            zeroed = int((want[mask] == 0).sum())
            assert stats["off_policy_masked_frac"] == pytest.approx(zeroed / n)
            c = want[mask]
            assert stats["is_ess"] == pytest.approx(float(c.sum()) ** 2 / (n * float((c * c).sum())) if c.any() else 0,
                                                    rel=1e-6)
            responses = [i for i in range(mask.shape[0]) if mask[i].any()]
            vetoed = [i for i in responses if veto and any(
                math.exp(float(prox[i, t] - behav[i, t])) < veto for t in range(mask.shape[1]) if mask[i, t])]
            assert stats["off_policy_vetoed_frac"] == pytest.approx(len(vetoed) / len(responses))


@pytest.mark.parametrize("name", ["tis", "sequence-tis", "decoupled"])
@pytest.mark.parametrize("band", ["token-band", "token-cap", "none"])
def test_a_mask_part_composes_with_any_weight(name, band):
    s = CorrectionSettings(cap=1.5, low=0.7, high=1.4, veto=0.3)
    for seed in range(20):
        prox, behav, mask = _batch(seed, spread=1.0)
        got, _ = off_policy_weights(prox, behav, mask, resolve_correction(name, band), s)
        assert torch.allclose(got.double(), _naive(prox, behav, mask, name, s, band), rtol=1e-5, atol=1e-6), seed


def test_a_huge_sequence_ratio_is_capped_without_overflow():
    T = 400
    prox, behav, mask = torch.zeros(1, T), torch.full((1, T), -1.0), torch.ones(1, T, dtype=torch.bool)  # Π w = e^400
    c, sums = off_policy_weights(prox, behav, mask, "sequence-tis", CorrectionSettings(cap=3.0))
    assert torch.allclose(c, torch.full_like(c, 3.0)) and sums.metrics()["off_policy_truncated_frac"] == 1


def test_statistics_summed_over_shards_are_the_whole_batchs():
    """Two ranks holding unequal shares: their sums, reduced, give what the whole batch gives."""
    prox, behav, mask = _batch(4, B=9, T=8, spread=1.2)
    s = CorrectionSettings(cap=1.5, veto=0.2)
    _, whole = off_policy_weights(prox, behav, mask, "tis", s)
    shards = [off_policy_weights(prox[a:b], behav[a:b], mask[a:b], "tis", s)[1] for a, b in ((0, 2), (2, 9))]
    theirs = {}  # rank 1's side of each collective, as rank 0's all-reduce would receive it
    shards[1].reduced(lambda t: theirs.setdefault("sum", t), lambda t: theirs.setdefault("max", t))
    total = shards[0].reduced(lambda t: t + theirs["sum"], lambda t: torch.maximum(t, theirs["max"]))
    assert total.metrics() == pytest.approx(whole.metrics(), rel=1e-6)  # float32 sums in another order
    per_rank_mean = sum(x.metrics()["is_weight_mean"] for x in shards) / 2
    assert per_rank_mean != pytest.approx(whole.metrics()["is_weight_mean"], rel=1e-6)  # what the old mean of means gave


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), name=st.sampled_from(NAMES))
def test_the_same_policy_needs_no_correction(seed, name):
    _, behav, mask = _batch(seed)
    c, sums = off_policy_weights(behav.clone(), behav, mask, name, CorrectionSettings(veto=0.5))
    assert torch.equal(c, mask.to(c.dtype))
    stats = sums.metrics()
    assert stats["off_policy_cut_frac"] == 0 and stats["kl_behav_prox"] == 0
    assert stats["is_ess"] == (1 if mask.any() else 0)


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
    before = {k: v.detach().clone() for k, v in tr.models.policy.named_parameters()}
    batch = tr.rollout(1)
    exact = torch.equal(batch.logp_old.where(batch.response_mask, 0), batch.logp_behaviour.where(batch.response_mask, 0))
    m = tr.learn(batch, 1).metrics
    if not exact:  # rounding differs somewhere in every response: every response is masked
        assert m["off_policy_cut_frac"] > 0
    if m["off_policy_cut_frac"] == 1:
        moved = [k for k, v in tr.models.policy.named_parameters() if "value_head" not in k and not torch.equal(v, before[k])]
        assert not moved, moved[:3]


def test_a_correction_with_the_samplers_logp_is_refused(tmp_path):
    from ppo_lm.runtime.errors import ConfigError

    cfg = tiny_config(tmp_path, algo__off_policy_correction="tis", rollout__logp_from_sampler=True)
    with pytest.raises(ConfigError, match="every weight is 1"):
        PPOTrainer(cfg, verifier=count_sevens)


def test_none_chosen_leaves_every_weight_at_one_and_says_what_the_lag_did():
    for seed in range(10):
        prox, behav, mask = _batch(seed)
        c, sums = off_policy_weights(prox, behav, mask, "none")
        _, tis = off_policy_weights(prox, behav, mask, "tis")
        assert torch.equal(c, mask.to(c.dtype))
        stats, corrected = sums.metrics(), tis.metrics()
        assert {k: stats[k] for k in ("is_weight_mean", "is_weight_max", "kl_behav_prox")} == \
            {k: corrected[k] for k in ("is_weight_mean", "is_weight_max", "kl_behav_prox")}


def test_a_stale_run_with_none_chosen_logs_the_ratios_it_does_not_correct(tmp_path):
    cfg = tiny_config(tmp_path, iterations=3, rollout__max_staleness=1, algo__off_policy_correction="none",
                      rollout__num_prompts=8, rollout__max_new_tokens=6, critic__warmup_iterations=0)
    history = PPOTrainer(cfg, verifier=count_sevens).train()
    assert history[-1]["staleness_max"] == 1 and history[-1]["is_weight_max"] != 1
    assert all(m["off_policy_cut_frac"] == 0 for m in history)


def test_the_trainer_composes_the_parts_it_is_given(tmp_path):
    """`tis` weights with IcePop's band and a veto: accepted, applied, and each part's statistics logged."""
    from ppo_lm.config.validate import validate_config

    kw = dict(iterations=1, rollout__num_prompts=8, rollout__max_new_tokens=6, optim__epochs=1,
              algo__off_policy_correction="tis", algo__off_policy_mask="token-band", algo__is_band_low=0.8,
              algo__is_veto=1e-4)
    cfg = tiny_config(tmp_path, **kw)
    validate_config(cfg)
    m = PPOTrainer(cfg, verifier=count_sevens).train_iteration(1).metrics
    assert m["off_policy_vetoed_frac"] == 0 and m["off_policy_masked_frac"] == 0 and m["is_ess"] > 0.999


def test_staleness_is_a_mean_over_the_batchs_sampled_tokens():
    from types import SimpleNamespace

    from ppo_lm.trainer.correction import staleness_metrics

    mask = torch.tensor([[1, 1, 1, 1], [1, 0, 0, 0], [1, 0, 0, 0]], dtype=torch.bool)
    m = staleness_metrics(SimpleNamespace(versions=torch.tensor([0, 1, 1])), mask, iteration=3)  # lags 2, 1, 1
    assert m == {"staleness_mean": pytest.approx((4 * 2 + 1 + 1) / 6), "staleness_max": 2.0}
