"""The fast paths give the plain transformers results: lean forward (models/lean.py) behind
PolicyModel / CriticModel / sequence_scores, and the lean KV-buffer decoder behind rollout sampling.

Reference everywhere: ``model(input_ids, attention_mask, position_ids).logits`` → log_softmax →
gather, on tiny models with left-padded prompts and right-padded responses of mixed lengths.
"""

from __future__ import annotations

import pytest
import torch
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    LlamaForTokenClassification,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen2ForTokenClassification,
)

from ppo_lm.models import lean_support, onednn
from ppo_lm.models.actor_critic import CriticModel, PolicyModel, sequence_scores
from ppo_lm.models.logprobs import position_ids_from_mask
from ppo_lm.rollout.sample.sampling import SamplingParams, _HFDecoder, _LeanDecoder, generate
from ppo_lm.rollout.score.batch import length_groups

V, P, T = 40, 6, 7
ARCHS = {
    "qwen2": (Qwen2Config, Qwen2ForCausalLM, Qwen2ForTokenClassification),
    "llama": (LlamaConfig, LlamaForCausalLM, LlamaForTokenClassification),
}


def _config(arch: str, kv_heads: int):
    return ARCHS[arch][0](vocab_size=V, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=kv_heads, max_position_embeddings=64,
                          tie_word_embeddings=False, pad_token_id=0, attention_bias=arch == "llama")


def _model(arch: str, kv_heads: int = 2, kind: int = 1):
    """kind 1: causal LM, 2: one-label token classifier (the critic's class)."""
    torch.manual_seed(0)
    cfg = _config(arch, kv_heads)
    cfg.num_labels = 1
    m = ARCHS[arch][kind](cfg)
    with torch.no_grad():  # non-zero biases/norm weights, so a dropped term would show
        for name, p in m.named_parameters():
            if name.endswith("bias") or "norm" in name:
                p.add_(torch.randn_like(p) * 0.1)
    return m.eval()


def _batch():
    """(B, P + T) ids/mask: prompts left-padded to P, responses right-padded (lengths 7, 3, 1, 5)."""
    g = torch.Generator().manual_seed(1)
    B = 4
    ids = torch.randint(3, V, (B, P + T), generator=g)
    mask = torch.ones(B, P + T, dtype=torch.long)
    for row, (pad, length) in enumerate([(0, 7), (2, 3), (5, 1), (1, 5)]):
        mask[row, :pad] = 0
        mask[row, P + length :] = 0
    return ids.masked_fill(mask == 0, 0), mask


def _reference_logp(lm, ids, mask, temperature=1.0):
    logits = lm(input_ids=ids, attention_mask=mask, position_ids=position_ids_from_mask(mask)).logits
    logp = torch.log_softmax(logits[:, P - 1 : -1].double() / temperature, -1)
    return logp.gather(-1, ids[:, P:, None]).squeeze(-1)


@pytest.mark.parametrize("arch,kv_heads", [("qwen2", 4), ("qwen2", 2), ("llama", 2)])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_policy_logprobs_match_transformers(arch, kv_heads, temperature):
    lm = _model(arch, kv_heads)
    assert lean_support.supported(lm.model)
    ids, mask = _batch()
    resp = mask[:, P:].bool()
    with torch.no_grad():
        ref = _reference_logp(lm, ids, mask, temperature)
        out = PolicyModel(lm)(ids, mask, P, temperature=temperature, with_entropy=True, entropy_grad=False)
    assert out["logp"].shape == (4, T)
    assert float((out["logp"] - ref).abs()[resp].max()) < 1e-5


def check_policy_matches_transformers():
    """PolicyModel's log-probs (within 1e-5) and their gradients equal the transformers forward's."""
    lm = _model("qwen2", 2)
    ids, mask = _batch()
    resp = mask[:, P:].bool()
    weights = torch.randn(4, T, generator=torch.Generator().manual_seed(2)).where(resp, 0)

    def grads(logp):
        lm.zero_grad()
        (logp.float() * weights).sum().backward()
        return [p.grad.clone() for p in lm.parameters()]

    ref_logp = _reference_logp(lm, ids, mask)
    logp = PolicyModel(lm)(ids, mask, P)["logp"]
    assert float((logp.detach() - ref_logp.detach()).abs()[resp].max()) < 1e-5
    ref = grads(ref_logp)
    for (name, _), a, b in zip(lm.named_parameters(), grads(logp), ref):
        assert float((a - b).abs().max()) <= 1e-5 + 1e-4 * float(b.abs().max()), name


def test_policy_gradients_match_transformers():
    check_policy_matches_transformers()


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_critic_values_and_scores_match_transformers(arch):
    model = _model(arch, 2, kind=2)
    ids, mask = _batch()
    with torch.no_grad():
        ref = model(input_ids=ids, attention_mask=mask, position_ids=position_ids_from_mask(mask)).logits[..., 0]
        values = CriticModel(model)(ids, mask, P)
        assert values.shape == (4, T + 1)
        valid = mask[:, P - 1 :].bool()
        assert float((values - ref[:, P - 1 :]).abs()[valid].max()) < 1e-5
        last = P + mask[:, P:].sum(1) - 1
        scores = sequence_scores(model, ids, mask, last, normalize=False)
    assert float((scores - ref[torch.arange(4), last]).abs().max()) < 1e-5


def test_unsupported_models_take_the_transformers_path():
    lm = _model("qwen2", 2)
    getattr(lm, "activation_checkpointing_enable", lm.gradient_checkpointing_enable)()
    assert not lean_support.supported(lm.model)
    ids, mask = _batch()
    with torch.no_grad():
        ref = _reference_logp(lm, ids, mask)
        out = PolicyModel(lm)(ids, mask, P)
    assert float((out["logp"] - ref).abs()[mask[:, P:].bool()].max()) < 1e-5


@pytest.mark.parametrize("arch,kv_heads", [("qwen2", 2), ("llama", 4)])
def test_lean_decoder_logits_match_full_forward(arch, kv_heads):
    """Prefill + KV-buffer decode steps give the logits of one full transformers forward."""
    lm = _model(arch, kv_heads)
    ids, mask = _batch()
    full_mask = mask.clone()
    full_mask[:, P:] = 1  # feed every response token (decode steps never see right padding)
    with torch.no_grad():
        ref = lm(input_ids=ids, attention_mask=full_mask, position_ids=position_ids_from_mask(full_mask)).logits
    for cls in (_LeanDecoder, _HFDecoder):
        dec = cls(lm, ids[:, :P], mask[:, :P], T)
        with torch.no_grad():
            steps = [dec.prefill()]
            pos = mask[:, :P].sum(-1)
            for t in range(T - 1):
                steps.append(dec.step(ids[:, P + t], pos + t, t))
        got = torch.stack(steps, 1)
        assert float((got - ref[:, P - 1 : -1]).abs().max()) < 1e-5, cls.__name__


@pytest.mark.parametrize("window", [None, 3])
def test_decode_plan_step_equals_the_general_lean_forward(window):
    """DecodePlan.hidden (the decode step) computes what lean.forward_hidden computes for one query per
    row with the same buffers and weights, bit for bit: left-padded prompts (key_valid), GQA, biases,
    a sliding window shorter than the rows."""
    from ppo_lm.models import lean
    from ppo_lm.models.decode import DecodePlan
    from ppo_lm.models.hf_compat import trunk

    lm = _model("qwen2", 2)
    if window:
        lm.config.use_sliding_window, lm.config.sliding_window, lm.config.max_window_layers = True, window, 1
        lm.config.layer_types = ["full_attention", "sliding_attention"]
    ids, mask = _batch()
    body = trunk(lm)
    plan = DecodePlan(body, 4)
    key_valid = torch.ones(4, P + T, dtype=torch.bool)
    key_valid[:, :P] = mask[:, :P].bool()
    cos_sin = lean.rope_table(body, P + T, torch.float32, "cpu")
    caches = [lean.KVBuffers(body, 4, P + T, torch.float32, "cpu") for _ in range(2)]
    pos = position_ids_from_mask(mask[:, :P])
    with torch.no_grad():
        for cache in caches:
            lean.forward_hidden(body, ids[:, :P], mask[:, :P], position_ids=pos, cos_sin=cos_sin, cache=cache,
                                key_valid=key_valid[:, :P], weights=plan.weights)
        nxt = mask[:, :P].sum(-1, keepdim=True)
        for t in range(T):
            tok, at = ids[:, P + t : P + t + 1], P + t
            general = lean.forward_hidden(body, tok, torch.ones_like(tok), position_ids=nxt + t, cos_sin=cos_sin,
                                          cache=caches[0], cache_pos=at, key_valid=key_valid[:, : at + 1],
                                          weights=plan.weights)
            step = plan.hidden(tok, nxt + t, cos_sin, caches[1], at, key_valid[:, : at + 1])
            assert torch.equal(step, general), t


@pytest.mark.parametrize("stops", [(), (5, 6, 7, 8, 9, 10)])
def test_lean_generate_samples_like_transformers_path(stops):
    """Same seed, same tokens: dropping finished rows and the buffers change nothing."""
    lm = _model("qwen2", 2)
    ids, mask = _batch()
    params = SamplingParams(max_new_tokens=T, stop_token_ids=stops)
    runs = [generate(lm, ids[:, :P], mask[:, :P], params, pad_token_id=0,
                     generator=torch.Generator().manual_seed(3), lean_path=flag) for flag in (True, False)]
    assert torch.equal(runs[0].responses, runs[1].responses)
    assert torch.equal(runs[0].mask, runs[1].mask) and torch.equal(runs[0].terminated, runs[1].terminated)
    if stops:
        assert runs[0].terminated.any(), "want some rows to stop early"


def test_min_new_tokens_gives_fixed_length():
    lm = _model("qwen2", 2)
    ids, mask = _batch()
    params = SamplingParams(max_new_tokens=T, min_new_tokens=T, stop_token_ids=tuple(range(3, V // 2)))
    gen = generate(lm, ids[:, :P], mask[:, :P], params, pad_token_id=0, generator=torch.Generator().manual_seed(0))
    assert gen.mask.all() and not gen.terminated.any()


@pytest.mark.parametrize("width_in, width_out", [(40, 24), (160, 136)])  # weight gradient: BLAS / oneDNN
def test_onednn_linear_matches_f_linear(width_in, width_out):
    """onednn.linear (oneDNN on CPU fp32) against F.linear: values and all three gradients, for layers
    below and above the width from which the weight gradient runs through oneDNN too."""
    assert width_in < onednn._ONEDNN_MIN_GRAD_WIDTH or min(width_in, width_out) >= onednn._ONEDNN_MIN_GRAD_WIDTH
    g = torch.Generator().manual_seed(4)
    x0 = torch.randn(3, 19, width_in, generator=g)[:, 2:]  # a non-contiguous slice, as the last layer passes
    w0, b0 = torch.randn(width_out, width_in, generator=g), torch.randn(width_out, generator=g)
    grad = torch.randn(3, 17, width_out, generator=g)
    results = []
    for fn in (onednn.linear, torch.nn.functional.linear):
        x, w, b = (t.clone().requires_grad_(True) for t in (x0, w0, b0))
        y = fn(x, w, b)
        y.backward(grad)
        results.append([y.detach(), x.grad, w.grad, b.grad])
    for a, b in zip(*results):
        assert float((a - b).abs().max()) < 1e-4 * (1 + float(b.abs().max()))
    with torch.no_grad():
        assert float((onednn.linear(x0, w0) - x0 @ w0.T).abs().max()) < 1e-4


@pytest.mark.skipif(onednn._REORDER is None, reason="this torch build has no oneDNN weight reorder")
def test_packed_weights_match_f_linear_at_any_row_count():
    """onednn.pack: a weight reordered once for about 4 rows gives F.linear's values for other row counts,
    with and without bias, 2-d and 3-d inputs; other dtypes stay as they are. The decoder's weights
    (every layer matrix and the LM head) are packed, so decoding takes this path."""
    g = torch.Generator().manual_seed(5)
    w, b = torch.randn(48, 40, generator=g), torch.randn(48, generator=g)
    packed = onednn.pack(w, 4)
    assert packed.is_mkldnn and not onednn.pack(w.to(torch.bfloat16), 4).is_mkldnn
    for shape in ((1, 40), (4, 40), (7, 40), (64, 40), (5, 1, 40)):
        x = torch.randn(*shape, generator=g)
        for bias in (None, b):
            ref = torch.nn.functional.linear(x, w, bias)
            assert float((onednn.linear(x, packed, bias) - ref).abs().max()) < 1e-4 * (1 + float(ref.abs().max()))
    lm = _model("qwen2", 2)
    ids, mask = _batch()
    dec = _LeanDecoder(lm, ids[:, :P], mask[:, :P], T)
    assert all(x.is_mkldnn for layer in dec.plan.weights for x in (layer.qkv, layer.gate_up, layer.o, layer.down))
    assert dec.head_w is not None and dec.head_w.is_mkldnn


def test_scoring_groups_follow_lengths():
    """Equal lengths: one forward over the batch; skewed lengths: length-sorted groups, each cut to its
    own longest response; every row exactly once either way."""
    same = length_groups(torch.full((64,), 64), 0)
    assert len(same) == 1 and same[0][1] == 64
    lengths = torch.tensor([64] * 4 + [3] * 60)
    groups = length_groups(lengths, 0)
    assert len(groups) > 1 and sorted(torch.cat([g for g, _ in groups]).tolist()) == list(range(64))
    assert all(int(lengths[g].max()) <= w <= int(lengths[g].max()) + 15 for g, w in groups)
    assert min(w for _, w in groups) == 16  # widths come in steps of 16 (few distinct shapes)
    fixed = length_groups(lengths, 10)
    assert [len(g) for g, _ in fixed] == [10] * 6 + [4]
