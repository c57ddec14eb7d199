"""Every algorithm option runs through the real loop, and gradient accumulation is exact."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from trainer_helpers import length_reward, tiny_config

from ppo_lm.algorithms import POLICY_LOSSES
from ppo_lm.trainer.ppo import PPOTrainer


@pytest.mark.parametrize(
    "overrides",
    [
        {"algo__kl_in": "loss", "algo__kl_estimator": "k3"},
        {"algo__adaptive_kl_target": 0.5, "algo__adaptive_kl_horizon": 100.0},
        {"critic__gae_lambda": 1.0, "algo__adaptive_lambda_alpha": 0.5},
        {"critic__target": "score"},
        {"algo__clip_eps_high": 0.28, "algo__dual_clip": 3.0, "critic__value_clip_eps": None},
        {"algo__loss_agg": "seq-mean-token-mean", "algo__entropy_coef": 0.01},
        {"algo__loss_agg": "seq-mean-token-sum-norm", "algo__whiten_advantages": False},
        {"algo__estimator": "dr_grpo", "rollout__samples_per_prompt": 2, "algo__loss_agg": "seq-mean-token-sum-norm"},
        {"algo__estimator": "rloo", "rollout__samples_per_prompt": 2, "algo__policy_loss": "pg"},
        {"optim__schedule": "cosine", "optim__warmup_steps": 2, "rollout__top_k": 5, "rollout__top_p": 0.9},
        {"critic__kind": "shared", "critic__value_grad_scale": 0.0},
        {"rollout__missing_eos_penalty": 1.0, "rollout__forward_batch_size": 3},
    ],
)
def test_option_runs_and_logs_finite_metrics(tmp_path, overrides):
    cfg = tiny_config(tmp_path, iterations=2, **overrides)
    history = PPOTrainer(cfg, verifier=length_reward).train()
    for m in history:
        for k, v in m.items():
            if k != "explained_variance":
                assert math.isfinite(v), (k, v)
    if "algo__adaptive_kl_target" in overrides:
        assert history[1]["kl_coef"] != history[0]["kl_coef"]
    if "rollout__missing_eos_penalty" in overrides:
        assert history[0]["score"] < 1.5  # truncated responses pay the penalty


def test_micro_batches_give_the_full_minibatch_gradient(tmp_path):
    def run(micro):
        cfg = tiny_config(tmp_path / str(micro), rollout__num_prompts=8, rollout__max_new_tokens=6,
                          optim__micro_batch_size=micro, optim__num_minibatches=2, optim__epochs=2)
        cfg.rollout.stop_tokens = list("0123456789")  # varied lengths
        tr = PPOTrainer(cfg, verifier=length_reward)
        tr.train_iteration(1)
        return {k: v.detach().clone() for k, v in tr.models.policy.state_dict().items()} | {
            f"c.{k}": v.detach().clone() for k, v in tr.models.critic.state_dict().items()}

    full, accumulated = run(0), run(1)
    for k in full:
        assert torch.allclose(full[k], accumulated[k], atol=1e-5, rtol=0), k


@pytest.mark.parametrize("packing", [False, True])
def test_update_groups_rows_by_length_with_the_same_gradient(tmp_path, monkeypatch, packing):
    """micro_batch_size = 0 splits a minibatch of skewed lengths into length-sorted micro-batches,
    each cut to its own longest response (the update's cost follows the real lengths) — or, when the
    models pack sequences, runs it whole and packed; the updated weights equal those of one padded
    forward/backward over the whole minibatch."""
    from ppo_lm.models import actor_critic
    from ppo_lm.trainer.update import micro_batches as _micro_batches

    monkeypatch.setattr(actor_critic, "PACKING", packing)

    def build(micro):
        cfg = tiny_config(tmp_path / str(micro), rollout__num_prompts=32, rollout__max_new_tokens=48,
                          optim__micro_batch_size=micro, optim__num_minibatches=1, optim__epochs=1)
        cfg.rollout.stop_tokens = list("0123456789")
        return PPOTrainer(cfg, verifier=length_reward)

    tr = build(0)
    batch = tr.rollout(1)
    rows = torch.arange(batch.size)
    groups = _micro_batches(rows, batch, 0)
    assert len(groups) > 1, batch.lengths
    assert sorted(torch.cat(groups).tolist()) == rows.tolist()
    longest = [int(batch.lengths[g].max()) for g in groups]
    assert longest == sorted(longest) and longest[0] < longest[-1]
    assert [len(g) for g in _micro_batches(rows, batch, 5)] == [5] * 6 + [2]
    assert [g.tolist() for g in _micro_batches(rows, batch, 0, packed=True)] == [rows.tolist()]

    def updated(tr):
        tr.learn(batch, 1)
        return {k: v.detach().clone() for k, v in tr.models.policy.state_dict().items()} | {
            f"c.{k}": v.detach().clone() for k, v in tr.models.critic.state_dict().items()}

    grouped = updated(tr)
    monkeypatch.setattr(actor_critic, "PACKING", False)
    whole = updated(build(32))
    for k in whole:
        assert torch.allclose(grouped[k], whole[k], atol=1e-5, rtol=0), k


def test_logp_from_sampler_skips_the_policy_scoring_forward(tmp_path, monkeypatch):
    from ppo_lm.models.actor_critic import PolicyModel

    calls = []
    real_forward = PolicyModel.forward
    monkeypatch.setattr(PolicyModel, "forward", lambda self, *a, **k: calls.append(self) or real_forward(self, *a, **k))
    cfg = tiny_config(tmp_path, iterations=1, optim__epochs=1, optim__num_minibatches=1,
                      rollout__num_prompts=16, rollout__max_new_tokens=8, rollout__logp_from_sampler=True)
    cfg.rollout.stop_tokens = list("0123456789")
    tr = PPOTrainer(cfg, verifier=length_reward)
    batch = tr.rollout(1)
    assert calls and all(m is tr.models.ref for m in calls)  # the reference's forwards only
    with torch.no_grad():
        ref = tr.models.policy(batch.input_ids, batch.attention_mask, batch.prompt_width)["logp"]
    assert float((batch.logp_old - ref).abs()[batch.response_mask].max()) < 1e-5
    metrics = tr.learn(batch, 1).metrics
    assert abs(metrics["ratio_max"] - 1) < 1e-4


def test_ratio_max_is_the_maximum_over_the_whole_update(tmp_path, monkeypatch):
    """``ratio_max`` is the largest ratio seen in any micro-batch of any minibatch and epoch, not a
    mean of their maxima (reference: every loss call's own masked max of exp(logp − logp_old))."""
    cfg = tiny_config(tmp_path, iterations=1, optim__epochs=3, optim__num_minibatches=2, optim__micro_batch_size=2,
                      rollout__num_prompts=8, rollout__max_new_tokens=6, optim__lr=3e-3)
    tr = PPOTrainer(cfg, verifier=length_reward)
    seen = []
    real = POLICY_LOSSES["ppo"]

    def recording(logp, logp_old, advantages, mask, **kw):
        seen.append(float(torch.exp(logp.detach() - logp_old)[mask.bool()].max()))
        return real(logp, logp_old, advantages, mask, **kw)

    monkeypatch.setitem(POLICY_LOSSES, "ppo", recording)
    metrics = tr.learn(tr.rollout(1), 1).metrics
    assert len(seen) >= 6 and max(seen) - min(seen) > 1e-3, "the maxima must differ for the test to mean anything"
    assert metrics["ratio_max"] == pytest.approx(max(seen), abs=1e-6)


def _policy_weights(tr):
    return [p.detach().clone() for p in tr.models.policy.lm.parameters()]


def test_kl_loss_uses_the_controllers_beta(tmp_path):
    """With the KL as a loss term, an adaptive β must reach the loss: a trainer whose controller holds
    β = 0.5 updates exactly like one configured with a fixed β = 0.5 (and unlike β = 0.05)."""
    def run(kl_coef, forced_beta=None):
        cfg = tiny_config(tmp_path / f"{kl_coef}-{forced_beta}", iterations=1, algo__kl_in="loss",
                          algo__kl_coef=kl_coef, algo__kl_estimator="k3", optim__epochs=2, optim__num_minibatches=1)
        tr = PPOTrainer(cfg, verifier=length_reward)
        batch = tr.rollout(1)
        torch.manual_seed(1)
        with torch.no_grad():  # a policy away from the reference, so the KL term has a gradient
            for p in tr.models.policy.lm.parameters():
                p.add_(0.05 * torch.randn_like(p))
        if forced_beta is not None:
            tr.training.kl_ctl.value = forced_beta
        tr.learn(batch, 1)
        return _policy_weights(tr)

    fixed, forced, default = run(0.5), run(0.05, forced_beta=0.5), run(0.05)
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(fixed, forced))
    assert max(float((a - b).abs().max()) for a, b in zip(fixed, default)) > 1e-5


@pytest.mark.parametrize("estimator,kl_in,kl_estimator,loss_agg", [
    ("gae", "reward", "k1", "token-mean"),
    ("reinforce++", "reward", "k1", "token-mean"),
    ("grpo", "loss", "k3", "token-mean"),
    ("rloo", "loss", "k3", "token-mean"),
    ("dr_grpo", "loss", "k3", "seq-mean-token-sum-norm"),
])
def test_auto_settings_follow_the_estimator(tmp_path, estimator, kl_in, kl_estimator, loss_agg):
    cfg = tiny_config(tmp_path, iterations=1, algo__estimator=estimator, rollout__samples_per_prompt=2)
    tr = PPOTrainer(cfg, verifier=length_reward)
    a = tr.cfg.algo
    assert (a.kl_in, a.kl_estimator, a.loss_agg) == (kl_in, kl_estimator, loss_agg)
    # the caller's config (and so the run's config.yaml) keeps "auto": reused with another estimator,
    # it resolves for that one
    assert (cfg.algo.kl_in, cfg.algo.kl_estimator, cfg.algo.loss_agg) == ("auto", "auto", "auto")


def test_grpo_default_kl_changes_the_update(tmp_path):
    """GRPO's advantages come from the scores alone, so its default KL (a loss term) must still act:
    β changes the updated weights."""
    def run(kl_coef):
        cfg = tiny_config(tmp_path / str(kl_coef), iterations=1, algo__estimator="grpo", algo__kl_coef=kl_coef,
                          rollout__samples_per_prompt=2, optim__epochs=2, optim__num_minibatches=1)
        tr = PPOTrainer(cfg, verifier=length_reward)
        batch = tr.rollout(1)
        torch.manual_seed(1)
        with torch.no_grad():
            for p in tr.models.policy.lm.parameters():
                p.add_(0.05 * torch.randn_like(p))
        tr.learn(batch, 1)
        return _policy_weights(tr)

    a, b = run(0.0), run(1.0)
    assert max(float((x - y).abs().max()) for x, y in zip(a, b)) > 1e-5


@pytest.mark.parametrize("agg", ["seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_token_statistics_do_not_depend_on_micro_batching(tmp_path, agg):
    """Clip fractions, approx KL and entropy are token means whatever the loss aggregation: splitting
    the minibatch into micro-batches of different lengths must not change them."""
    def run(micro):
        cfg = tiny_config(tmp_path / str(micro), iterations=1, algo__loss_agg=agg, optim__epochs=2,
                          optim__num_minibatches=1, optim__micro_batch_size=micro, rollout__max_new_tokens=8,
                          optim__actor_lr=3e-3)
        cfg.rollout.stop_tokens = list("0123456789")
        tr = PPOTrainer(cfg, verifier=length_reward)
        batch = tr.rollout(1)
        lengths = batch.response_mask.sum(1)
        assert int(lengths.max()) > int(lengths.min()), "rows of different lengths, or the test means nothing"
        return tr.learn(batch, 1).metrics

    whole, split = run(0), run(2)
    assert whole["policy_clip_frac"] > 0
    for k in ("policy_clip_frac", "approx_kl", "approx_kl_k3", "entropy", "policy_loss", "value_clip_frac"):
        assert split[k] == pytest.approx(whole[k], rel=1e-4, abs=1e-7), k


def test_logged_learning_rate_is_the_one_the_steps_used(tmp_path):
    """A linear decay over 2 iterations of 2 steps: the steps use 3e-3·(1, 3/4, 1/2, 1/4); each
    iteration logs the rate of its last step (the schedule's next value, 0 at the end, was logged)."""
    cfg = tiny_config(tmp_path, iterations=2, optim__epochs=1, optim__num_minibatches=2, optim__schedule="linear",
                      optim__actor_lr=3e-3)
    tr = PPOTrainer(cfg, verifier=length_reward)
    lrs = [tr.train_iteration(i).metrics["lr_actor"] for i in (1, 2)]
    assert lrs == pytest.approx([3e-3 * 3 / 4, 3e-3 / 4])


def test_kl_loss_with_a_very_unlikely_pad_token_keeps_gradients_finite(tmp_path, monkeypatch):
    """An unpacked forward computes log-probs at padded positions too; where the pad token is very
    unlikely (log-prob below ≈ −88.7), a k3 KL loss term masked after its estimator overflowed to
    0·inf = NaN gradients and every minibatch was skipped. Masked first, the update runs."""
    from ppo_lm.models import actor_critic

    monkeypatch.setattr(actor_critic, "PACKING", False)
    real = actor_critic.PolicyModel.forward

    def unlikely_pads(self, input_ids, attention_mask, prompt_width, **kw):
        out = real(self, input_ids, attention_mask, prompt_width, **kw)
        pads = attention_mask[:, prompt_width:] == 0
        out["logp"] = out["logp"] - 200.0 * pads  # the pad token is this unlikely after a response
        return out

    monkeypatch.setattr(actor_critic.PolicyModel, "forward", unlikely_pads)
    cfg = tiny_config(tmp_path, iterations=1, rollout__max_new_tokens=8, algo__estimator="grpo",
                      rollout__samples_per_prompt=2, algo__kl_in="loss", algo__kl_estimator="k3", algo__kl_coef=0.1,
                      optim__max_nonfinite_in_row=100)
    cfg.rollout.stop_tokens = list("0123456789")
    tr = PPOTrainer(cfg, verifier=length_reward)
    batch = tr.rollout(1)
    assert not batch.response_mask.all(), "the test needs padded rows"
    metrics = tr.learn(batch, 1).metrics
    assert metrics["nonfinite_skipped_total"] == 0
    assert math.isfinite(metrics["grad_norm_actor"]) and math.isfinite(metrics["kl_loss"])
    assert metrics["kl_clamp_frac"] == 0.0


def test_gradient_checkpointing_flag_trains_the_same(tmp_path):
    """model.gradient_checkpointing recomputes the layers of the policy and the critic in the backward;
    the iteration's statistics equal a run without it (the transformers forward instead of the lean
    one: equal to 1e-5, not bit for bit)."""
    from ppo_lm.models.hf_compat import is_checkpointed

    runs = {}
    for flag in (False, True):
        cfg = tiny_config(tmp_path / str(flag), model__cpu_lanes=1, model__gradient_checkpointing=flag)
        tr = PPOTrainer(cfg, verifier=length_reward)
        assert is_checkpointed(tr.models.policy.lm) is flag and is_checkpointed(tr.models.critic.model) is flag
        runs[flag] = tr.train_iteration(1).metrics
    for k, v in runs[False].items():
        if not k.endswith(("_s", "_per_s")):
            assert runs[True][k] == pytest.approx(v, rel=1e-4, abs=1e-5), k


def _one_iteration(tmp_path, name, **overrides):
    cfg = tiny_config(tmp_path / name, iterations=1, optim__num_minibatches=2, **overrides)
    trainer = PPOTrainer(cfg, verifier=length_reward)
    trainer.train()
    steps = lambda opt: int(next(iter(opt.state.values()))["step"])  # noqa: E731
    return trainer, steps(trainer.training.learner.actor_opt), steps(trainer.training.learner.critic_opt)


def test_critic_epochs_give_the_critic_its_own_passes_and_leave_the_other_model_as_it_was(tmp_path):
    """critic.epochs: the epochs past the shorter count train one model alone. The epochs both
    share draw the same shuffles, so the policy after epochs 1 with critic_epochs 3 is the policy of
    epochs 1 alone, and the critic after critic_epochs 1 with epochs 3 is the critic of epochs 1."""
    base, a0, c0 = _one_iteration(tmp_path, "base", optim__epochs=1)
    more, a1, c1 = _one_iteration(tmp_path, "critic3", optim__epochs=1, critic__epochs=3)
    fewer, a2, c2 = _one_iteration(tmp_path, "actor3", optim__epochs=3, critic__epochs=1)
    assert (a0, c0) == (2, 2) and (a1, c1) == (2, 6) and (a2, c2) == (6, 2)  # optimiser steps: 2 minibatches
    same = lambda m1, m2: all(torch.equal(p, q) for p, q in zip(m1.parameters(), m2.parameters()))  # noqa: E731
    assert same(base.models.policy, more.models.policy) and not same(base.models.critic, more.models.critic)
    assert same(base.models.critic, fewer.models.critic) and not same(base.models.policy, fewer.models.policy)


@pytest.mark.parametrize("field", ["epochs", "warmup_iterations"])
def test_critic_settings_with_a_critic_free_estimator_are_refused(tmp_path, field):
    from ppo_lm.runtime.errors import ConfigError

    cfg = tiny_config(tmp_path, algo__estimator="grpo", rollout__samples_per_prompt=2, **{f"critic__{field}": 2})
    with pytest.raises(ConfigError, match=rf"`critic.{field}`=2 has no critic to train: `algo.estimator`='grpo'"):
        PPOTrainer(cfg, verifier=length_reward)


def test_no_bootstrap_with_a_critic_free_estimator_is_refused(tmp_path):
    from ppo_lm.runtime.errors import ConfigError

    cfg = tiny_config(tmp_path, algo__estimator="rloo", rollout__samples_per_prompt=2, algo__bootstrap_truncated=False)
    with pytest.raises(ConfigError, match=r"^`algo.bootstrap_truncated`=false has no effect: `algo.estimator`='rloo'"):
        PPOTrainer(cfg, verifier=length_reward)


@pytest.mark.parametrize("bootstrap", [False, True])
def test_a_truncated_response_ends_its_return_unless_bootstrapped(tmp_path, bootstrap):
    """Every response runs to the limit (min = max tokens), so every row is truncated. With
    `algo.bootstrap_truncated` the critic's targets are the λ-return with V_old(x_{l+1}) after the last
    token; without it, with V = 0 there. Checked against a naive backwards loop over each row."""
    cfg = tiny_config(tmp_path / "run", rollout__min_new_tokens=4, algo__bootstrap_truncated=bootstrap)
    tr = PPOTrainer(cfg, verifier=length_reward)
    torch.manual_seed(0)
    with torch.no_grad():  # a zero value head would make V_old(x_{l+1}) = 0 either way
        for name, p in tr.models.critic.named_parameters():
            if "score" in name:
                p.normal_(0.0, 0.5)
    batch = tr.rollout(1)
    assert not batch.terminated.any() and bool((batch.bootstrap_values.abs() > 1e-3).all())
    done = tr.learn(batch, 1)
    lam, gamma = cfg.algo.gae_lambda, cfg.algo.gamma
    for i in range(batch.size):
        n = int(batch.loss_mask[i].sum())
        v = batch.values_old[i, :n].double().tolist()
        r = done.targets.rewards[i, :n].double().tolist()
        v_next = float(batch.bootstrap_values[i]) if bootstrap else 0.0
        adv, want = 0.0, [0.0] * n
        for t in reversed(range(n)):
            after = v[t + 1] if t + 1 < n else v_next
            adv = r[t] + gamma * after - v[t] + gamma * lam * adv
            want[t] = adv + v[t]
        got = done.targets.returns[i, :n].double().tolist()
        assert got == pytest.approx(want, abs=1e-5), (i, bootstrap)
    assert done.batch.bootstrap_values.abs().sum() > 0 if bootstrap else not done.batch.bootstrap_values.any()


def test_the_bootstrap_switch_changes_nothing_where_no_response_is_cut(tmp_path):
    """`algo.bootstrap_truncated` acts on the last TD residual of cut responses only: on a rollout whose
    every row ended with a stop token, a learning step with it on and one with it off leave the same
    policy and critic, bit for bit (the same start, shuffles and rollout)."""
    models = []
    for bootstrap in (True, False):
        cfg = tiny_config(tmp_path / str(bootstrap), algo__bootstrap_truncated=bootstrap)
        tr = PPOTrainer(cfg, verifier=length_reward)
        torch.manual_seed(0)
        with torch.no_grad():  # a nonzero head, so that V_old(x_{l+1}) would move the targets if it were used
            for name, p in tr.models.critic.named_parameters():
                if "score" in name:
                    p.normal_(0.0, 0.5)
        batch = tr.rollout(1)
        batch = dataclasses.replace(batch, terminated=torch.ones_like(batch.terminated))
        assert bool((batch.bootstrap_values.abs() > 1e-3).any())
        tr.learn(batch, 1)
        models.append((tr.models.policy, tr.models.critic))
    for m1, m2 in zip(*models):
        assert all(torch.equal(p, q) for p, q in zip(m1.parameters(), m2.parameters()))
