"""End-to-end trainer tests on tiny models: learning, ratio = 1, critics, checkpoints, resume."""

from __future__ import annotations

import json

import pytest
import torch
from trainer_helpers import count_sevens, tiny_config

from ppo_lm.records.metrics_log import is_timing_key
from ppo_lm.trainer.checkpoint.folders import latest_checkpoint, write_manifest
from ppo_lm.trainer.ppo import PPOTrainer


def _mean(xs):
    return sum(xs) / len(xs)


@pytest.mark.parametrize(
    "estimator,extra",
    [("gae", {}), ("grpo", {"rollout__samples_per_prompt": 4}), ("rloo", {"rollout__samples_per_prompt": 4})],
)
def test_score_rises_on_toy_reward(tmp_path, estimator, extra):
    cfg = tiny_config(tmp_path, iterations=14, algo__estimator=estimator, optim__actor_lr=3e-3, **extra)
    cfg.rollout.num_prompts = 32 if estimator == "gae" else 8
    history = PPOTrainer(cfg, verifier=count_sevens).train()
    first = _mean([m["score"] for m in history[:3]])
    last = _mean([m["score"] for m in history[-3:]])
    assert last > max(3 * first, 0.06), (estimator, [round(m["score"], 3) for m in history])


def test_first_minibatch_ratio_is_one(tmp_path):
    cfg = tiny_config(tmp_path, iterations=1, optim__epochs=1, optim__num_minibatches=1,
                      rollout__num_prompts=16, rollout__max_new_tokens=8)
    tr = PPOTrainer(cfg, verifier=count_sevens)
    metrics = tr.train_iteration(1).metrics
    # one minibatch, one epoch: the only update step sees π_θ = π_old
    assert abs(metrics["ratio_max"] - 1) < 1e-5
    assert metrics["policy_clip_frac"] == 0
    assert metrics["approx_kl"] < 1e-10


def test_logp_old_matches_training_forward_on_a_minibatch(tmp_path):
    cfg = tiny_config(tmp_path, rollout__num_prompts=16, rollout__max_new_tokens=8)
    tr = PPOTrainer(cfg, verifier=count_sevens)
    batch = tr.rollout(1)
    assert not batch.terminated.all(), "want a mix of terminated and truncated rows"
    mb = batch.select(torch.tensor([3, 0, 7, 12, 5]))  # another batch size and width than the rollout
    out = tr.models.policy(mb.input_ids, mb.attention_mask, mb.prompt_width)
    diff = (out["logp"] - mb.logp_old).where(mb.response_mask, 0).abs().max()
    assert float(diff.detach()) < 1e-5
    values = tr.models.critic(mb.input_ids, mb.attention_mask, mb.prompt_width)
    assert float((values[:, :-1] - mb.values_old).where(mb.response_mask, 0).abs().max().detach()) < 1e-5


@pytest.mark.parametrize("critic", ["separate", "shared"])
def test_both_critics_train(tmp_path, critic):
    cfg = tiny_config(tmp_path, iterations=3, critic__kind=critic, rollout__num_prompts=16)
    tr = PPOTrainer(cfg, verifier=count_sevens)
    head = tr.models.policy.value_head if critic == "shared" else tr.models.critic.model.score
    before = head.weight.detach().clone()
    history = tr.train()
    assert not torch.equal(before, head.weight.detach())
    assert all(m["value_loss"] >= 0 for m in history)
    assert "explained_variance" in history[-1] and "grad_norm_critic" in history[-1]
    if critic == "shared":
        assert tr.models.critic is None


def test_critic_free_estimators_build_no_critic(tmp_path):
    cfg = tiny_config(tmp_path, algo__estimator="reinforce++")
    tr = PPOTrainer(cfg, verifier=count_sevens)
    assert tr.models.critic is None and tr.models.policy.value_head is None
    m = tr.train_iteration(1).metrics
    assert "value_loss" not in m and m["policy_loss"] == m["policy_loss"]


def test_critic_warmup_freezes_policy(tmp_path):
    cfg = tiny_config(tmp_path, critic__warmup_iterations=1)
    tr = PPOTrainer(cfg, verifier=lambda prompts, responses, **kw: [1.0] * len(prompts))
    before = [p.detach().clone() for p in tr.models.policy.lm.parameters()]
    critic_before = tr.models.critic.model.score.weight.detach().clone()
    tr.train_iteration(1)
    assert all(torch.equal(a, b) for a, b in zip(before, tr.models.policy.lm.parameters()))
    assert not torch.equal(critic_before, tr.models.critic.model.score.weight)
    tr.train_iteration(2)
    assert not all(torch.equal(a, b) for a, b in zip(before, tr.models.policy.lm.parameters()))


def _metrics(path):
    rows = [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not is_timing_key(k)} for r in rows]


def test_resume_equals_uninterrupted(tmp_path):
    full = tiny_config(tmp_path / "full", iterations=5, log__save_every=1)
    PPOTrainer(full, verifier=count_sevens).train()

    part = tiny_config(tmp_path / "part", iterations=3, log__save_every=1)
    PPOTrainer(part, verifier=count_sevens).train()
    # a crash after iteration 3 may leave later lines; the resumed run must replace them
    with open(tmp_path / "part" / "metrics.jsonl", "a") as f:
        f.write(json.dumps({"iteration": 4, "score": -1.0}) + "\n")
    resumed = tiny_config(tmp_path / "part", iterations=5, resume=True, log__save_every=1)
    PPOTrainer(resumed, verifier=count_sevens).train()

    a, b = _metrics(tmp_path / "full"), _metrics(tmp_path / "part")
    assert [r["iteration"] for r in b] == [1, 2, 3, 4, 5]
    assert a == b  # bit-exact on CPU, every non-timing metric


def test_checkpoint_round_trip_through_from_pretrained(tmp_path):
    from transformers import AutoModelForCausalLM, AutoModelForTokenClassification, AutoTokenizer

    cfg = tiny_config(tmp_path, iterations=2, log__keep_last=1, log__save_every=1)
    tr = PPOTrainer(cfg, verifier=count_sevens)
    tr.train()
    it, path = latest_checkpoint(tmp_path)
    assert it == 2 and len(list((tmp_path / "checkpoints").iterdir())) == 1  # keep_last=1
    lm = AutoModelForCausalLM.from_pretrained(path / "policy")
    critic = AutoModelForTokenClassification.from_pretrained(path / "critic")
    tok = AutoTokenizer.from_pretrained(path / "policy")
    assert tok.pad_token_id == tr.models.tokenizer.pad_token_id
    for (n, p), q in zip(tr.models.policy.lm.state_dict().items(), lm.state_dict().values()):
        assert torch.equal(p, q), n
    for p, q in zip(tr.models.critic.model.state_dict().values(), critic.state_dict().values()):
        assert torch.equal(p, q)


def test_interrupted_checkpoint_write_keeps_previous(tmp_path, monkeypatch):
    cfg = tiny_config(tmp_path, iterations=1, log__save_every=1)
    PPOTrainer(cfg, verifier=count_sevens).train()
    cfg2 = tiny_config(tmp_path, iterations=2, resume=True, log__save_every=1)
    tr = PPOTrainer(cfg2, verifier=count_sevens)

    def boom(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(torch, "save", boom)
    with pytest.raises(KeyboardInterrupt):
        tr.train()
    it, path = latest_checkpoint(tmp_path)
    assert it == 1 and (path / "policy" / "model.safetensors").is_file()
    monkeypatch.undo()
    tr3 = PPOTrainer(tiny_config(tmp_path, iterations=2, resume=True), verifier=count_sevens)
    tr3.train()
    assert latest_checkpoint(tmp_path)[0] == 2
    assert not list((tmp_path / "checkpoints").glob(".tmp-*"))


def test_outputs_written(tmp_path):
    cfg = tiny_config(tmp_path, iterations=2, log__sample_every=1, log__num_samples=3)
    PPOTrainer(cfg, verifier=count_sevens).train()
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in rows] == [1, 2]
    spec_keys = {"score", "shaped_reward", "ref_kl", "kl_coef", "approx_kl", "policy_clip_frac", "value_clip_frac",
                 "policy_loss", "value_loss", "explained_variance", "entropy", "response_length_mean",
                 "response_length_max", "truncated_frac", "advantage_mean", "advantage_std", "grad_norm_actor",
                 "grad_norm_critic", "lr_actor", "lr_critic", "rollout_tokens_per_s", "update_tokens_per_s",
                 "generate_s", "score_s", "update_s"}
    assert spec_keys <= set(rows[0])
    assert all(isinstance(v, int | float) or v is None for r in rows for v in r.values())
    samples = (tmp_path / "samples.jsonl").read_text().splitlines()
    assert len(samples) == 6 and {"prompt", "response", "score"} <= set(json.loads(samples[0]))
    assert (tmp_path / "config.yaml").is_file()


def test_resume_reads_a_checkpoint_split_into_several_files(tmp_path):
    """transformers splits big models into model-0000k-of-0000n.safetensors plus an index; resuming
    must read those as it reads one file."""
    from transformers import AutoModelForCausalLM, AutoModelForTokenClassification

    PPOTrainer(tiny_config(tmp_path, iterations=1, log__save_every=1), verifier=count_sevens).train()
    _, path = latest_checkpoint(tmp_path)
    for sub, cls in (("policy", AutoModelForCausalLM), ("critic", AutoModelForTokenClassification)):
        model = cls.from_pretrained(path / sub)
        (path / sub / "model.safetensors").unlink()
        model.save_pretrained(path / sub, max_shard_size="20KB")
        assert (path / sub / "model.safetensors.index.json").is_file()
    write_manifest(path)  # as if the checkpoint had been written this way
    tr = PPOTrainer(tiny_config(tmp_path, iterations=2, resume=True, log__save_every=1), verifier=count_sevens)
    tr.train()
    assert [r["iteration"] for r in _metrics(tmp_path)] == [1, 2]
