"""Models as users have them: tied embeddings, grouped-query attention, ``rope_scaling`` and the Llama,
Qwen2, Qwen3, Mistral, Gemma / Gemma 2 / Gemma 3 (text) and Phi-3 families, each as a tiny random
config, give the plain transformers forward's log-probs and values (≤ 1e-5) — through the lean path of
``ppo_lm.models.lean`` where it applies, through the model's own forward otherwise (each case asserts
which one it took).

Reference everywhere: ``lm(input_ids, attention_mask, position_ids)`` with position ids from the mask
→ log_softmax → gather, on left-padded prompts with right-padded responses of varied lengths.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
import transformers
from torch import nn
from transformers import (
    Gemma2Config,
    Gemma2ForCausalLM,
    Gemma2ForTokenClassification,
    Gemma3ForCausalLM,
    Gemma3TextConfig,
    Gemma3TextForSequenceClassification,
    GemmaConfig,
    GemmaForCausalLM,
    GemmaForTokenClassification,
    LlamaConfig,
    LlamaForCausalLM,
    LlamaForTokenClassification,
    MistralConfig,
    MistralForCausalLM,
    MistralForTokenClassification,
    Phi3Config,
    Phi3ForCausalLM,
    Phi3ForTokenClassification,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen2ForTokenClassification,
    Qwen3Config,
    Qwen3ForCausalLM,
    Qwen3ForTokenClassification,
)

from ppo_lm.models import actor_critic, lean, lean_support
from ppo_lm.models.actor_critic import CriticModel, PolicyModel
from ppo_lm.models.hf_compat import scalar_head, trunk
from ppo_lm.models.logprobs import position_ids_from_mask
from ppo_lm.rollout.sample.sampling import SamplingParams, generate

V, P, T = 64, 6, 7
SMALL = dict(vocab_size=V, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=64, pad_token_id=0, bos_token_id=1, eos_token_id=2)


@dataclass(frozen=True)
class Family:
    config: type
    lm: type
    critic: type  # the separate critic's class (AutoModelForTokenClassification's, when it has one)
    kwargs: dict
    lean: bool  # True: the lean path; False: transformers' own forward


FAMILIES = {
    # Llama: GQA with q/k/v/o biases; MHA with tied input/output embeddings; Llama 3 RoPE scaling + MQA;
    # linear RoPE scaling with a head dim that is not hidden / heads.
    "llama-gqa": Family(LlamaConfig, LlamaForCausalLM, LlamaForTokenClassification,
                        dict(attention_bias=True), True),
    "llama-tied": Family(LlamaConfig, LlamaForCausalLM, LlamaForTokenClassification,
                         dict(num_key_value_heads=4, tie_word_embeddings=True), True),
    "llama-rope-llama3": Family(LlamaConfig, LlamaForCausalLM, LlamaForTokenClassification,
                                dict(num_key_value_heads=1, rope_scaling=dict(
                                    rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                    original_max_position_embeddings=8)), True),
    "llama-rope-linear": Family(LlamaConfig, LlamaForCausalLM, LlamaForTokenClassification,
                                dict(head_dim=16, rope_scaling=dict(rope_type="linear", factor=2.0)), True),
    # Qwen2: q/k/v biases and GQA; tied (the small Qwen2.5 models are); YaRN; sliding window on layer 1.
    "qwen2-gqa": Family(Qwen2Config, Qwen2ForCausalLM, Qwen2ForTokenClassification, {}, True),
    "qwen2-tied": Family(Qwen2Config, Qwen2ForCausalLM, Qwen2ForTokenClassification,
                         dict(tie_word_embeddings=True), True),
    "qwen2-rope-yarn": Family(Qwen2Config, Qwen2ForCausalLM, Qwen2ForTokenClassification,
                              dict(rope_scaling=dict(rope_type="yarn", factor=4.0,
                                                     original_max_position_embeddings=16)), True),
    "qwen2-sliding": Family(Qwen2Config, Qwen2ForCausalLM, Qwen2ForTokenClassification,
                            dict(use_sliding_window=True, sliding_window=4, max_window_layers=1), True),
    # Qwen3: RMSNorm of q and k per head, explicit head dim, tied.
    "qwen3": Family(Qwen3Config, Qwen3ForCausalLM, Qwen3ForTokenClassification,
                    dict(head_dim=16, tie_word_embeddings=True), True),
    # Mistral: sliding window (4 < the 13-token rows) on every layer.
    "mistral": Family(MistralConfig, MistralForCausalLM, MistralForTokenClassification,
                      dict(sliding_window=4), True),
    # Phi-3: fused qkv_proj / gate_up_proj, partial rotary, longrope (short factors up to 16 positions),
    # sliding window.
    "phi3": Family(Phi3Config, Phi3ForCausalLM, Phi3ForTokenClassification,
                   dict(sliding_window=5, original_max_position_embeddings=16, rope_scaling=dict(
                       rope_type="longrope", partial_rotary_factor=0.5, original_max_position_embeddings=16,
                       short_factor=[1.0, 1.5], long_factor=[2.0, 5.0])), True),
    # Gemma family: transformers' forward (embedding × √d, (1 + w) RMSNorm, GELU-tanh MLP; Gemma 2 and 3:
    # sandwich norms, sliding windows; Gemma 2: attention and final-logit soft-capping; Gemma 3: q/k norm,
    # local/global RoPE with linear scaling on the global layers).
    "gemma": Family(GemmaConfig, GemmaForCausalLM, GemmaForTokenClassification, dict(head_dim=8), False),
    "gemma2": Family(Gemma2Config, Gemma2ForCausalLM, Gemma2ForTokenClassification,
                     dict(head_dim=8, query_pre_attn_scalar=8, sliding_window=4, final_logit_softcapping=3.0,
                          attn_logit_softcapping=2.0), False),
    # Gemma3ForCausalLM has no *ForTokenClassification in transformers: its sequence classifier's body
    # and `score` head serve as the per-token critic here.
    "gemma3": Family(Gemma3TextConfig, Gemma3ForCausalLM, Gemma3TextForSequenceClassification,
                     dict(head_dim=8, query_pre_attn_scalar=8, sliding_window=4,
                          layer_types=["sliding_attention", "full_attention"],
                          rope_scaling=dict(rope_type="linear", factor=2.0)), False),
}
LEAN = [name for name, fam in FAMILIES.items() if fam.lean]
# Packing, the plain causal mask and unpadded decoding are lean-path layouts; the transformers path sees
# the same call whatever they are, so its families run the padded batch only.
POLICY_CASES = [(name, layout) for name in FAMILIES
                for layout in (("packed", "padded", "full") if name in LEAN else ("padded",))]
GENERATE_CASES = [(name, temperature, padded) for name in FAMILIES
                  for temperature, padded in [(0.0, True), (0.7, True)] + [(0.0, False)] * (name in LEAN)]


def _config(name: str, **overrides):
    fam = FAMILIES[name]
    return fam.config(**{**SMALL, **fam.kwargs, **overrides})


def _perturb(model: nn.Module) -> nn.Module:
    """Weights large enough (and biases / norm weights non-zero) that every term shows in the log-probs."""
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    return model.eval()


def _lm(name: str, **overrides) -> nn.Module:
    torch.manual_seed(0)
    return _perturb(FAMILIES[name].lm(_config(name, **overrides)))


def _critic(name: str) -> nn.Module:
    torch.manual_seed(1)
    return _perturb(FAMILIES[name].critic(_config(name, num_labels=1)))


def _batch(padded: bool = True):
    """(B, P + T) ids/mask: prompts left-padded to P, responses right-padded (lengths 7, 3, 1, 5) —
    mostly padding, so the lean path packs it (unless packing is off); or (``padded=False``) every
    row full: no mask beyond the causal one, nothing to pack."""
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, V, (4, P + T), generator=g)
    mask = torch.ones(4, P + T, dtype=torch.long)
    for row, (pad, length) in enumerate([(0, 7), (2, 3), (5, 1), (1, 5)] if padded else []):
        mask[row, :pad] = 0
        mask[row, P + length:] = 0
    return ids.masked_fill(mask == 0, 0), mask


def _reference_logp(lm, ids, mask, prompt_width, temperature=1.0):
    logits = lm(input_ids=ids, attention_mask=mask, position_ids=position_ids_from_mask(mask)).logits
    logp = torch.log_softmax(logits[:, prompt_width - 1 : -1].double() / temperature, -1)
    return logp.gather(-1, ids[:, prompt_width:, None]).squeeze(-1)


def _reference_hidden(model, ids, mask):
    return trunk(model)(input_ids=ids, attention_mask=mask, position_ids=position_ids_from_mask(mask)).last_hidden_state


@pytest.fixture
def lean_calls(monkeypatch):
    """How many times the lean forward ran (the PolicyModel/CriticModel and the lean decoder call it)."""
    calls = []
    inner = lean.forward_hidden

    def counted(*args, **kwargs):
        calls.append(1)
        return inner(*args, **kwargs)

    monkeypatch.setattr(lean, "forward_hidden", counted)
    return calls


def test_every_family_builds_with_this_transformers():
    """Every family in the issue exists in this transformers (5.x) and takes the documented path."""
    assert int(transformers.__version__.split(".")[0]) >= 5
    for name, fam in FAMILIES.items():
        lm = _lm(name)
        assert lean_support.supported(trunk(lm)) is fam.lean, name
    # dynamic-NTK RoPE rescales from the history of calls: the transformers path
    assert not lean_support.supported(trunk(_lm("llama-gqa", rope_scaling=dict(rope_type="dynamic", factor=2.0))))
    for name in ("llama-tied", "qwen2-tied", "qwen3", "gemma"):  # tied: lm_head is the embedding
        lm = _lm(name)
        assert lm.get_output_embeddings().weight is lm.get_input_embeddings().weight, name
    assert _lm("llama-gqa").get_output_embeddings().weight is not _lm("llama-gqa").get_input_embeddings().weight


@pytest.mark.parametrize("name,layout", POLICY_CASES)
def test_policy_logprobs_match_transformers(name, layout, lean_calls, monkeypatch):
    """Packed rows (block-diagonal mask), the padded batch (left-pad keys masked) and full rows (the
    plain causal mask), each with the last layer cut to the response positions; temperatures 1 and 0.7."""
    monkeypatch.setattr(actor_critic, "PACKING", layout == "packed")
    lm = _lm(name)
    ids, mask = _batch(padded=layout != "full")
    resp = mask[:, P:].bool()
    policy = PolicyModel(lm)
    with torch.no_grad():
        logits = lm(input_ids=ids, attention_mask=mask, position_ids=position_ids_from_mask(mask)).logits
        for temperature in (1.0, 0.7):
            ref = torch.log_softmax(logits[:, P - 1 : -1].double() / temperature, -1)
            ref = ref.gather(-1, ids[:, P:, None]).squeeze(-1)
            out = policy(ids, mask, P, temperature=temperature, with_entropy=True, entropy_grad=False)
            assert out["logp"].shape == (4, T) and bool(out["entropy"].isfinite().all())
            err = float((out["logp"] - ref).abs()[resp].max())
            assert err <= 1e-5, f"{name}, T={temperature}: max |Δ log-prob| {err:.3g}"
    assert bool(lean_calls) is FAMILIES[name].lean


@pytest.mark.parametrize("name", LEAN)
def test_lean_policy_gradients_match_transformers(name):
    """The lean forward's gradients reach every parameter as transformers' do (fused Phi-3 projections,
    Qwen3's q/k norms, the sliding-window masks included)."""
    lm = _lm(name)
    ids, mask = _batch()
    resp = mask[:, P:].bool()
    weights = torch.randn(4, T, generator=torch.Generator().manual_seed(2)).where(resp, 0)

    def grads(logp):
        lm.zero_grad()
        (logp.float() * weights).sum().backward()
        return {n: p.grad.clone() for n, p in lm.named_parameters() if p.grad is not None}

    ref = grads(_reference_logp(lm, ids, mask, P, 0.7))
    got = grads(PolicyModel(lm)(ids, mask, P, temperature=0.7)["logp"])
    assert got.keys() == ref.keys()
    for n, b in ref.items():
        assert float((got[n] - b).abs().max()) <= 1e-5 + 1e-4 * float(b.abs().max()), (name, n)


@pytest.mark.parametrize("name", list(FAMILIES))
def test_values_match_transformers_hidden_states(name, lean_calls):
    """A shared value head on the policy and a separate critic, against the head applied directly to
    transformers' last hidden states at positions P − 1 … P + T − 1."""
    ids, mask = _batch()
    valid = mask[:, P - 1:].bool()
    lm = _lm(name)
    torch.manual_seed(3)
    head = nn.Linear(lm.config.hidden_size, 1)
    with torch.no_grad():
        ref = head(_reference_hidden(lm, ids, mask)[:, P - 1:]).squeeze(-1)
        values = PolicyModel(lm, value_head=head)(ids, mask, P, with_values=True)["values"]
    assert values.shape == (4, T + 1)
    assert float((values - ref).abs()[valid].max()) <= 1e-5, name

    critic = _critic(name)
    with torch.no_grad():
        ref = scalar_head(critic)(_reference_hidden(critic, ids, mask)[:, P - 1:]).squeeze(-1)
        values = CriticModel(critic)(ids, mask, P)
    assert float((values - ref).abs()[valid].max()) <= 1e-5, name
    assert bool(lean_calls) is FAMILIES[name].lean


@pytest.mark.parametrize("name,temperature,padded", GENERATE_CASES)
def test_generate_matches_training_forward(name, temperature, padded, lean_calls):
    """Greedy and sampled decoding, from left-padded and from full prompts: the lean decoder (where the
    family has one) and the transformers decoder give the same tokens (12 rows, which leave the decode
    batch as they stop); the sampled log-probs equal the training forward's."""
    lm = _lm(name)
    g = torch.Generator().manual_seed(5)
    prompt = torch.randint(3, V, (12, P), generator=g)
    prompt_mask = torch.ones_like(prompt)
    for row, pad in enumerate([0, 2, 5, 1] * 3 if padded else []):
        prompt_mask[row, :pad] = 0
    prompt = prompt.masked_fill(prompt_mask == 0, 0)

    def run(lean_path, params):
        return generate(lm, prompt, prompt_mask, params, pad_token_id=0, generator=torch.Generator().manual_seed(4),
                        lean_path=lean_path, return_logprobs=True)

    # stop tokens: what half the rows say second, so that rows stop (and leave the decode batch) early
    probe = run(False, SamplingParams(max_new_tokens=2, temperature=temperature))
    params = SamplingParams(max_new_tokens=T, temperature=temperature,
                            stop_token_ids=tuple(sorted(set(probe.responses[:6, 1].tolist()))))

    gen = run(None, params)  # the default choice
    assert bool(lean_calls) is FAMILIES[name].lean
    hf = run(False, params)
    assert torch.equal(gen.responses, hf.responses) and torch.equal(gen.mask, hf.mask), name
    assert int((gen.mask.sum(1) < T).sum()) >= 4, "want ≥ 4 of the 12 rows to stop early"
    assert float((gen.logprobs - hf.logprobs).abs().max()) <= 1e-5, name

    seq = torch.cat([prompt, gen.responses], 1)
    seq_mask = torch.cat([prompt_mask, gen.mask.long()], 1)
    with torch.no_grad():
        logp = PolicyModel(lm)(seq, seq_mask, P, temperature=temperature or 1.0)["logp"]
        ref = _reference_logp(lm, seq, seq_mask, P, temperature or 1.0)
    m = gen.mask
    assert float((gen.logprobs - logp).abs()[m].max()) <= 1e-5, name
    assert float((ref - logp).abs()[m].max()) <= 1e-5, name


def test_longrope_past_its_original_context(lean_calls):
    """Phi-3 longrope switches to its long factors once a call reaches past the original context: the
    lean training forward follows (its RoPE table is built for the call's longest position), and
    decoding that crosses it takes the transformers decoder, which switches mid-sequence as
    transformers does."""
    lm = _lm("phi3", rope_scaling=dict(rope_type="longrope", partial_rotary_factor=0.5,
                                       original_max_position_embeddings=8, short_factor=[1.0, 1.5],
                                       long_factor=[2.0, 5.0]), original_max_position_embeddings=8)
    body = trunk(lm)
    assert lean_support.supported(body) and lean_support.rope_fits(body, 8) and not lean_support.rope_fits(body, 9)
    ids, mask = _batch()  # rows up to 13 positions: the long factors
    with torch.no_grad():
        ref = _reference_logp(lm, ids, mask, P)
        out = PolicyModel(lm)(ids, mask, P)["logp"]
        short = _reference_logp(lm, ids[:, :8], mask[:, :8], P)  # rows ≤ 8 positions: the short ones
        out_short = PolicyModel(lm)(ids[:, :8], mask[:, :8], P)["logp"]
    assert float((out - ref).abs()[mask[:, P:].bool()].max()) <= 1e-5
    assert float((out_short - short).abs()[mask[:, P:8].bool()].max()) <= 1e-5
    assert float((out[:, :2] - out_short).abs()[mask[:, P:8].bool()].max()) > 1e-4  # the factors differ

    lean_calls.clear()
    generate(lm, ids[:, :P], mask[:, :P], SamplingParams(max_new_tokens=T, temperature=0.0), pad_token_id=0)
    assert not lean_calls  # 6 + 7 positions > 8: the transformers decoder
    generate(lm, ids[:, :P], mask[:, :P], SamplingParams(max_new_tokens=2, temperature=0.0), pad_token_id=0)
    assert lean_calls  # 6 + 2 ≤ 8: the lean one


@pytest.mark.parametrize("name,without", [
    ("mistral", dict(sliding_window=None)),
    ("qwen2-sliding", dict(use_sliding_window=False)),
    ("phi3", dict(sliding_window=None)),
    ("llama-rope-llama3", dict(rope_scaling=None)),
    ("qwen2-rope-yarn", dict(rope_scaling=None)),
    ("gemma2", dict(final_logit_softcapping=None, attn_logit_softcapping=None)),
])
def test_each_feature_changes_the_logprobs(name, without):
    """The equivalence tests above would catch a dropped feature: on the same weights, the model without
    it (a sliding window, RoPE scaling, soft-capping) gives log-probs ≥ 1e-4 away."""
    ids, mask = _batch()
    lm = _lm(name)
    other = FAMILIES[name].lm(_config(name, **without)).eval()
    other.load_state_dict(lm.state_dict())
    with torch.no_grad():
        a, b = _reference_logp(lm, ids, mask, P), _reference_logp(other, ids, mask, P)
    assert float((a - b).abs()[mask[:, P:].bool()].max()) > 1e-4, name


def test_a_stray_logit_transform_key_is_not_trusted():
    """A Llama-family config carrying ``final_logit_softcapping`` (which LlamaForCausalLM ignores, while
    the policy's output head would apply it) leaves the lean path, so the policy's output-head probe
    sees the mismatch and refuses the model instead of training on another distribution."""
    lm = _lm("llama-gqa", final_logit_softcapping=0.5)
    assert not lean_support.supported(trunk(lm))
    with pytest.raises(ValueError, match="its logits are not its output embeddings"):
        PolicyModel(lm)


@pytest.mark.parametrize("name", ["gemma3", "phi3", "qwen3"])
def test_a_ppo_iteration_with_a_separate_critic(tmp_path, name):
    """The trainer builds a separate critic for each family — for Gemma 3 text, which has no
    token-classification head in transformers, from its sequence-classification class — and one
    iteration gives finite metrics."""
    import math

    from trainer_helpers import count_sevens, tiny_config

    from ppo_lm.tasks.equations import build_tokenizer
    from ppo_lm.trainer.ppo import PPOTrainer

    tok = build_tokenizer()
    lm = FAMILIES[name].lm(_config(name, vocab_size=len(tok), pad_token_id=tok.pad_token_id,
                                   eos_token_id=tok.eos_token_id, bos_token_id=tok.bos_token_id))
    tr = PPOTrainer(tiny_config(tmp_path / name), policy=lm, tokenizer=tok, verifier=count_sevens)
    assert tr.models.critic is not None and type(tr.models.critic.model).__name__.startswith(type(lm).__name__[:5])
    m = tr.train_iteration(1).metrics
    assert all(math.isfinite(v) for k, v in m.items() if k != "explained_variance")
