"""Cheaper critics (docs/critic.md, "What a critic costs"): a LoRA critic on the frozen reference's
body in full fine-tuning (`critic.lora_r`) and a value head on frozen features (`critic.kind`
frozen). Each holds its body by reference, trains only what it should, and resumes bit for bit."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file
from trainer_helpers import length_reward, other_weights, tiny_config

from ppo_lm.config.validate import validate_config
from ppo_lm.models import lora
from ppo_lm.models.actor_critic import _hidden
from ppo_lm.models.hf_compat import scalar_head, trunk
from ppo_lm.records.metrics_log import is_timing_key
from ppo_lm.runtime.errors import ConfigError
from ppo_lm.trainer.banner import banner
from ppo_lm.trainer.checkpoint.folders import latest_checkpoint
from ppo_lm.trainer.ppo import PPOTrainer

VARIANTS = {"lora": dict(critic__lora_r=4), "frozen": dict(critic__kind="frozen")}


def _config(path, variant: str, **kw):
    kw.setdefault("critic__lr", 1e-2)
    return tiny_config(path, **VARIANTS[variant], **kw)


def _body_shares_the_references_storage(tr) -> list[str]:
    """Names of the critic's body tensors that are not the reference's very tensors (empty: all are)."""
    ref = {n: p for n, p in trunk(tr.models.ref.lm).named_parameters()}
    return [n for n, p in trunk(tr.models.critic.model).named_parameters() if not lora.is_adapter_key(n)
            and p.data_ptr() != ref[n.replace(".base_layer.", ".")].data_ptr()]


@pytest.mark.parametrize("variant", ["lora", "frozen"])
def test_the_critics_body_is_the_references_and_only_what_should_train_does(tmp_path, variant):
    tr = PPOTrainer(_config(tmp_path, variant, iterations=3), verifier=length_reward)
    assert _body_shares_the_references_storage(tr) == []
    trains = "LoRA r 4 and the value head train" if variant == "lora" else "the value head trains"
    assert f"; its body frozen ({trains})" in banner(tr)
    assert all(p.requires_grad for p in tr.models.policy.lm.parameters())  # the policy trains in full
    trained = {n for n, p in tr.models.critic.model.named_parameters() if p.requires_grad}
    heads = {"score.weight", "score.bias"}
    if variant == "frozen":
        assert trained == heads
    else:
        assert heads < trained and all(lora.is_adapter_key(n) for n in trained - heads)
    before = {n: p.detach().clone() for n, p in tr.models.critic.model.named_parameters()}
    ref_before = {n: p.detach().clone() for n, p in tr.models.ref.lm.named_parameters()}
    history = tr.train()
    after = dict(tr.models.critic.model.named_parameters())
    moved = {n for n in before if not torch.equal(before[n], after[n])}
    assert moved == trained  # every trained tensor moved, no frozen one did
    assert all(torch.equal(p, ref_before[n]) for n, p in tr.models.ref.lm.named_parameters())
    assert history[-1]["value_loss"] > 0 and "grad_norm_critic" in history[-1]


def test_a_frozen_critics_values_are_its_head_on_the_references_features(tmp_path):
    tr = PPOTrainer(_config(tmp_path, "frozen", iterations=2), verifier=length_reward)
    tr.train()
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, len(tr.models.tokenizer), (4, 9), generator=g)
    mask = torch.ones_like(ids)
    mask[1, :2] = 0
    with torch.no_grad():
        values = tr.models.critic(ids, mask, 5)
        features = _hidden(trunk(tr.models.ref.lm), ids, mask, 4)
        expected = scalar_head(tr.models.critic.model)(features).squeeze(-1)
    valid = mask[:, 4:].bool()
    assert torch.allclose(values.where(valid, 0), expected.where(valid, 0), atol=1e-6, rtol=0)
    assert expected.where(valid, 0).abs().max() > 0  # the head has moved off its zero start


def _metrics(path):
    rows = [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not is_timing_key(k)} for r in rows]


@pytest.mark.parametrize("variant", ["lora", "frozen"])
def test_resume_equals_uninterrupted(tmp_path, variant):
    kw = dict(log__save_every=1, optim__epochs=1)
    PPOTrainer(_config(tmp_path / "full", variant, iterations=2, **kw), verifier=length_reward).train()
    PPOTrainer(_config(tmp_path / "part", variant, iterations=1, **kw), verifier=length_reward).train()
    PPOTrainer(_config(tmp_path / "part", variant, iterations=2, resume=True, **kw), verifier=length_reward).train()
    assert _metrics(tmp_path / "full") == _metrics(tmp_path / "part")


def test_a_frozen_critics_checkpoint_holds_its_value_head_alone(tmp_path):
    tr = PPOTrainer(_config(tmp_path, "frozen", iterations=1, log__save_every=1), verifier=length_reward)
    tr.train()
    critic_dir = latest_checkpoint(tmp_path)[1] / "critic"
    saved = load_file(str(critic_dir / "value_head.safetensors"))
    assert set(saved) == {"score.weight", "score.bias"} and not list(critic_dir.glob("model*.safetensors"))
    assert torch.equal(saved["score.weight"], tr.models.critic.model.score.weight)


def test_a_frozen_critic_resumes_from_a_checkpoint_that_saved_it_whole(tmp_path):
    """Checkpoints written before the head was saved alone hold the whole critic; they still resume."""
    kw = dict(log__save_every=1, optim__epochs=1)
    PPOTrainer(_config(tmp_path / "full", "frozen", iterations=2, **kw), verifier=length_reward).train()
    tr = PPOTrainer(_config(tmp_path / "part", "frozen", iterations=1, **kw), verifier=length_reward)
    tr.train()
    critic_dir = latest_checkpoint(tmp_path / "part")[1] / "critic"
    (critic_dir / "value_head.safetensors").unlink()
    tr.models.critic.model.save_pretrained(critic_dir, safe_serialization=True)
    manifest = critic_dir.parent / "manifest.json"
    manifest.unlink()  # (a checkpoint without a manifest is checked by reading its files)
    PPOTrainer(_config(tmp_path / "part", "frozen", iterations=2, resume=True, **kw), verifier=length_reward).train()
    assert _metrics(tmp_path / "full") == _metrics(tmp_path / "part")


def test_a_frozen_critic_on_another_body_is_refused_on_resume(tmp_path, saved_policy):
    kw = dict(model__policy=str(saved_policy), model__tokenizer=str(saved_policy), log__save_every=1)
    PPOTrainer(_config(tmp_path / "run", "frozen", iterations=1, **kw), verifier=length_reward).train()
    with other_weights(saved_policy, tmp_path / "other"), \
            pytest.raises(ConfigError, match="critic's base weights differ from the ones its value head"):
        PPOTrainer(_config(tmp_path / "run", "frozen", iterations=2, resume=True, **kw), verifier=length_reward).train()


def test_a_frozen_critic_with_adapters_is_refused_before_anything_loads(tmp_path):
    cfg = tiny_config(tmp_path, critic__kind="frozen", critic__lora_r=4)
    with pytest.raises(ConfigError, match="`critic.lora_r`=4 with `critic.kind`='frozen'"):
        validate_config(cfg, 1)


@pytest.mark.parametrize("over, field, match", [
    (dict(critic__kind="shared", critic__lora_r=4), "critic.lora_r", "only a separate critic"),
    (dict(algo__estimator="grpo", rollout__samples_per_prompt=2, critic__lora_r=4), "critic.lora_r",
     "has no critic"),
    (dict(model__lora_alpha=8.0), "model.lora_alpha", "no critic has adapters"),
    (dict(critic__kind="frozen", critic__value_grad_scale=0.5), "critic.value_grad_scale", "a frozen critic"),
])
def test_a_critic_setting_nothing_uses_is_named(tmp_path, over, field, match):
    from ppo_lm.config.unused import unused_settings

    found = {u.field: u for u in unused_settings(tiny_config(tmp_path, **over))}
    assert field in found and found[field].refused
    assert match in found[field].message


def test_critic_adapters_use_the_lora_settings(tmp_path):
    from ppo_lm.config.unused import unused_settings

    cfg = tiny_config(tmp_path, critic__lora_r=4, model__lora_alpha=8.0)
    assert not [u for u in unused_settings(cfg) if u.field.startswith("model.")]


def test_auto_gives_a_small_policy_a_value_head_that_trains_alone(tmp_path):
    tr = PPOTrainer(tiny_config(tmp_path, critic__kind="auto"), verifier=length_reward)
    assert tr.models.critic is None and tr.models.policy.value_head is not None and tr.models.policy.value_grad_scale == 0.0
    assert tr.sized.values["critic.kind"] == "shared"
    text = banner(tr)
    assert "critic    shared: a value head on the policy's body, trained alone" in text and "critic.kind shared" in text
    trunk_before = {n: p.detach().clone() for n, p in tr.models.policy.lm.named_parameters()}
    tr.training.learner.zero_grad()
    batch = tr.rollout(1)
    from ppo_lm.trainer.update import (  # the value loss alone: the policy's trunk gets no gradient
        UpdateBatch,
        ppo_update,
    )

    tr.cfg.optim.epochs = 1
    ppo_update(tr.training.learner, UpdateBatch.of(batch, torch.zeros_like(batch.logp_old), torch.ones_like(batch.logp_old), None),
               tr.cfg, tr.training.shuffle_gen, train_policy=False)
    assert all(torch.equal(p, trunk_before[n]) for n, p in tr.models.policy.lm.named_parameters())
    assert tr.models.policy.value_head.bias.abs().item() > 0  # the head moved toward the returns of 1


def test_a_setting_the_auto_critic_ignores_is_named_once_the_policy_loads(tmp_path):
    cfg = tiny_config(tmp_path, critic__kind="auto", critic__lora_r=4)
    with pytest.raises(ConfigError, match="`critic.lora_r`=4 is unused.*auto resolved to 'shared'"):
        PPOTrainer(cfg, verifier=length_reward)
