"""Log-probs come from the model's own logits, including the scaling some architectures apply after
the output embeddings; an unknown transform is refused when the policy is built."""

from __future__ import annotations

import pytest
import torch
from transformers import (
    AutoModelForCausalLM,
    CohereConfig,
    Gemma2Config,
    GPT2Config,
    GPT2LMHeadModel,
    GraniteConfig,
    Qwen2Config,
)

from ppo_lm.models.actor_critic import PolicyModel

SMALL = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, pad_token_id=0, eos_token_id=1, max_position_embeddings=64)


def _batch(P=5, T=4):
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(2, 64, (3, P + T), generator=g)
    mask = torch.ones_like(ids)
    mask[1, :2] = 0  # a left-padded prompt
    mask[2, P + 2:] = 0  # a short response
    return ids, mask, P


def _reference_logp(lm, ids, mask, P, temperature):
    pos = (mask.cumsum(-1) - 1).clamp_min(0)
    with torch.no_grad():
        logits = lm(input_ids=ids, attention_mask=mask, position_ids=pos).logits.float()
    lp = torch.log_softmax(logits[:, P - 1:-1] / temperature, -1)
    return lp.gather(-1, ids[:, P:, None]).squeeze(-1)


@pytest.mark.parametrize("config", [
    GraniteConfig(**SMALL, logits_scaling=8.0),
    Gemma2Config(**SMALL, head_dim=8, final_logit_softcapping=2.0),
    CohereConfig(**SMALL, logit_scale=0.25),
])
def test_logit_scaling_architectures_match_their_own_logits(config):
    torch.manual_seed(0)
    lm = AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():
        for p in lm.parameters():
            p.add_(0.1 * torch.randn_like(p))  # logits big enough for the scaling to matter
    ids, mask, P = _batch()
    with torch.no_grad():
        ours = PolicyModel(lm)(ids, mask, P, temperature=0.7)["logp"]
    ref = _reference_logp(lm, ids, mask, P, 0.7)
    m = mask[:, P:].bool()
    assert float((ours - ref).abs()[m].max()) < 1e-5


class _ScaledGPT2(GPT2LMHeadModel):
    def forward(self, *args, **kwargs):
        out = super().forward(*args, **kwargs)
        out.logits = out.logits * 3.0
        return out


def test_an_unknown_logit_transform_is_refused():
    lm = _ScaledGPT2(GPT2Config(vocab_size=64, n_embd=32, n_layer=1, n_head=4, n_positions=32)).eval()
    with pytest.raises(ValueError, match="_ScaledGPT2: its logits are not its output embeddings"):
        PolicyModel(lm)
    PolicyModel(GPT2LMHeadModel(lm.config).eval())  # the plain one passes the probe


def test_bf16_temperature_divides_in_fp32():
    """The sampler divides fp32 logits by T; the training forward must too (a bf16 quotient is rounded
    again: ≈ 4e-3 off in log-prob here). Reference: the same bf16 logits, divided in fp32."""
    from ppo_lm.models.actor_critic import _hidden, output_logits
    from ppo_lm.models.hf_compat import trunk

    torch.manual_seed(0)
    lm = AutoModelForCausalLM.from_config(Qwen2Config(**SMALL)).to(torch.bfloat16).eval()
    with torch.no_grad():
        for p in lm.parameters():
            p.add_(0.2 * torch.randn_like(p))
    ids, mask, P = _batch()
    with torch.no_grad():
        logp = PolicyModel(lm)(ids, mask, P, temperature=0.7)["logp"]
        logits = output_logits(lm, _hidden(trunk(lm), ids, mask, P - 1)[:, :-1])
        ref = torch.log_softmax(logits.float() / 0.7, -1).gather(-1, ids[:, P:, None]).squeeze(-1)
        rounded = torch.log_softmax((logits / 0.7).float(), -1).gather(-1, ids[:, P:, None]).squeeze(-1)
    m = mask[:, P:].bool()
    assert float((rounded - ref).abs()[m].max()) > 1e-3, "bf16 rounding must matter for the test to mean anything"
    assert float((logp - ref).abs()[m].max()) < 1e-5


def test_a_critic_from_the_reward_model_starts_on_the_rewards_scale():
    """PPO's rewards are the reward model's normalised scores (raw − mean)/std; a critic initialised
    from it must predict that, not the raw score, at the scored (last) position."""
    from transformers import Qwen2ForSequenceClassification

    from ppo_lm.config.train import TrainConfig
    from ppo_lm.models.actor_critic import REWARD_MEAN_KEY, REWARD_STD_KEY, sequence_scores
    from ppo_lm.trainer.roles import build_critic

    torch.manual_seed(0)
    policy = AutoModelForCausalLM.from_config(Qwen2Config(**SMALL)).eval()
    rm = Qwen2ForSequenceClassification(Qwen2Config(**SMALL, num_labels=1)).eval()
    setattr(rm.config, REWARD_MEAN_KEY, 0.7)
    setattr(rm.config, REWARD_STD_KEY, 0.25)
    critic = build_critic(TrainConfig(), policy, rm).eval()
    ids, mask, P = _batch()
    mask = torch.ones_like(mask)  # full rows: the last position is the scored one
    with torch.no_grad():
        values = critic(ids, mask, P)  # (B, T + 1): the last column is V after the whole sequence
        scores = sequence_scores(rm, ids, mask, torch.full((ids.shape[0],), ids.shape[1] - 1))
    assert float(scores.abs().max()) > 1.0  # normalising moves them visibly
    torch.testing.assert_close(values[:, -1], scores, atol=1e-5, rtol=1e-5)


def test_no_dropout_left_in_training_mode():
    """Gradient checkpointing needs training mode; with dropout disabled it must compute what eval
    mode computes, attention dropout (read at forward time) included."""
    from ppo_lm.models.hf_compat import disable_dropout

    torch.manual_seed(0)
    lm = AutoModelForCausalLM.from_config(Qwen2Config(**SMALL, attention_dropout=0.5),
                                          attn_implementation="eager")
    disable_dropout(lm)
    ids, mask, _ = _batch()
    with torch.no_grad():
        evaluated = lm(input_ids=ids, attention_mask=mask).logits
        lm.train()
        trained = lm(input_ids=ids, attention_mask=mask).logits
    assert torch.equal(evaluated, trained)
