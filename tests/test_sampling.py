"""Rollout sampling: the categorical draw, filtering, and a decode batch that shrinks as rows finish."""

from __future__ import annotations

import pytest
import torch
from test_perf_equivalence import V, _model

from ppo_lm.rollout.sample import sampling
from ppo_lm.rollout.sample.sampling import (
    SamplingParams,
    decode_rows,
    generate,
    sample_categorical,
    sample_next,
)


def test_sample_categorical_frequencies_match_probabilities():
    g = torch.Generator().manual_seed(0)
    probs = torch.tensor([[0.5, 0.0, 0.3, 0.2, 0.0],
                          [0.0, 0.0, 0.0, 0.0, 1.0],
                          [0.1, 0.2, 0.3, 0.4, 0.0],
                          [0.0, 0.25, 0.0, 0.75, 0.0]])
    n = 50_000
    draws = sample_categorical(probs.repeat_interleave(n, 0), g).view(4, n)
    freq = torch.stack([torch.bincount(row, minlength=5) for row in draws]).double() / n
    sigma = (probs.double() * (1 - probs.double()) / n).sqrt()
    assert bool((freq - probs.double()).abs().le(5 * sigma + 1e-12).all()), freq
    assert bool((freq[probs == 0] == 0).all())  # a zero-probability token is never drawn


def test_sample_categorical_never_draws_past_the_support():
    """Unnormalised rows whose mass sits at the front: the fallback keeps draws inside the support."""
    probs = torch.zeros(1000, 64)
    probs[:, :3] = torch.rand(1000, 3, generator=torch.Generator().manual_seed(1)) + 1e-3
    idx = sample_categorical(probs, torch.Generator().manual_seed(2))
    assert int(idx.max()) <= 2


def test_sample_next_greedy_top_k_top_p():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2000, V, generator=g)
    greedy = sample_next(logits, SamplingParams(max_new_tokens=1, temperature=0.0), g)
    assert torch.equal(greedy, logits.argmax(-1))
    top3 = logits.topk(3, -1).indices
    drawn = sample_next(logits, SamplingParams(max_new_tokens=1, top_k=3), g)
    assert bool((drawn[:, None] == top3).any(-1).all())
    # top_p: the drawn token is inside the smallest prefix of sorted probabilities reaching p
    p = torch.softmax(logits, -1)
    sorted_p, order = p.sort(-1, descending=True)
    allowed = (sorted_p.cumsum(-1) - sorted_p) < 0.5
    drawn = sample_next(logits, SamplingParams(max_new_tokens=1, top_p=0.5), g)
    rank = (order == drawn[:, None]).float().argmax(-1)
    assert bool(allowed.gather(-1, rank[:, None]).all())


def test_decode_rows_steps():
    assert decode_rows(64, 64) == 64
    assert decode_rows(57, 64) == 64
    assert decode_rows(56, 64) == 56
    assert decode_rows(17, 64) == 24
    assert decode_rows(1, 64) == 8
    assert decode_rows(5, 6) == 6


def _prompts(B: int, P: int = 5):
    g = torch.Generator().manual_seed(4)
    return torch.randint(3, V, (B, P), generator=g), torch.ones(B, P, dtype=torch.long)


@pytest.mark.parametrize("lean_path", [True, False])
def test_rows_leaving_the_decode_batch_change_no_response(monkeypatch, lean_path):
    """Greedy decoding of 32 prompts with many stop tokens: finished rows leave the batch in steps of
    8 rows, and every response equals the one decoded with all rows kept to the end."""
    lm = _model("qwen2", 2)
    ids, mask = _prompts(32)
    params = SamplingParams(max_new_tokens=12, temperature=0.0, stop_token_ids=tuple(range(3, V, 5)))
    decoder_cls = sampling._LeanDecoder if lean_path else sampling._HFDecoder
    sizes = []
    real_select = decoder_cls.select
    monkeypatch.setattr(decoder_cls, "select", lambda self, keep: (sizes.append(keep.numel()), real_select(self, keep)))
    shrinking = generate(lm, ids, mask, params, pad_token_id=0, lean_path=lean_path)
    assert sizes and all(s % sampling.DECODE_ROWS_STEP == 0 for s in sizes) and sizes == sorted(sizes, reverse=True)
    monkeypatch.setattr(sampling, "DECODE_ROWS_STEP", 10**6)  # never shrink
    shrunk_to = list(sizes)
    full = generate(lm, ids, mask, params, pad_token_id=0, lean_path=lean_path)
    assert sizes == shrunk_to  # the second run kept every row
    lengths = shrinking.mask.sum(1)
    assert len(set(lengths.tolist())) > 3, "want rows to finish at varied steps"
    assert torch.equal(shrinking.responses, full.responses) and torch.equal(shrinking.mask, full.mask)
    assert torch.equal(shrinking.terminated, full.terminated)
    stops = torch.tensor(params.stop_token_ids)
    last = shrinking.responses.gather(1, (lengths - 1).clamp_min(0)[:, None]).squeeze(1)
    assert bool(torch.isin(last[shrinking.terminated], stops).all())
    assert bool((lengths[~shrinking.terminated] == 12).all())
    assert bool((shrinking.responses[~shrinking.mask] == 0).all())


@pytest.mark.parametrize("lean_path", [True, False])
def test_sampler_logprobs_equal_the_training_forward(lean_path):
    """The decode logits' log-probs of the sampled tokens (full softmax at the temperature: before
    top-k and the min_new_tokens mask) equal PolicyModel's on the finished sequences within 1e-5."""
    from ppo_lm.models.actor_critic import PolicyModel

    lm = _model("qwen2", 2)
    ids, mask = _prompts(12)
    mask[:3, :2] = 0  # some left-padded prompts
    ids = ids.masked_fill(mask == 0, 0)
    params = SamplingParams(max_new_tokens=9, temperature=0.7, top_k=10, min_new_tokens=2,
                            stop_token_ids=tuple(range(3, V, 5)))
    gen = generate(lm, ids, mask, params, pad_token_id=0, generator=torch.Generator().manual_seed(1),
                   lean_path=lean_path, return_logprobs=True)
    assert gen.terminated.any() and not gen.terminated.all()
    full_ids = torch.cat([ids, gen.responses], 1)
    full_mask = torch.cat([mask, gen.mask.long()], 1)
    with torch.no_grad():
        ref = PolicyModel(lm)(full_ids, full_mask, ids.shape[1], temperature=0.7)["logp"]
    assert float((gen.logprobs - ref).abs()[gen.mask].max()) < 1e-5
    assert bool((gen.logprobs[~gen.mask] == 0).all())


def test_a_sampled_pad_token_is_an_ordinary_response_token_counted_by_length():
    """Nothing masks the pad token's logit (that would sample from another distribution than the one
    the update scores): a sampled pad inside a response is kept, ends nothing, counts in the
    response's length (every mask is by length, none by id) and is scored like any other token."""
    from torch import nn

    from ppo_lm.models.actor_critic import PolicyModel

    lm = _model("qwen2", 2)
    pad, stops = 0, tuple(range(3, V, 5))
    head = nn.Linear(lm.lm_head.in_features, V, bias=True)
    with torch.no_grad():
        head.weight.copy_(lm.lm_head.weight)
        head.bias.zero_()
        head.bias[pad] = 2.0  # the pad token drawn often
    lm.lm_head = head
    ids, mask = _prompts(16)
    gen = generate(lm, ids, mask, SamplingParams(max_new_tokens=8, stop_token_ids=stops), pad_token_id=pad,
                   generator=torch.Generator().manual_seed(0), return_logprobs=True)
    lengths = gen.mask.sum(1)
    inside = (gen.responses == pad) & gen.mask
    inside[torch.arange(len(lengths)), (lengths - 1).clamp_min(0)] = False  # before each response's last token
    assert inside.any() and gen.terminated.any()
    assert torch.equal(gen.mask, torch.arange(gen.mask.shape[1]) < lengths[:, None])  # a prefix: by length
    is_stop = torch.isin(gen.responses, torch.tensor(stops)) & gen.mask
    first_stop = torch.where(is_stop.any(1), is_stop.float().argmax(1) + 1, 8)
    assert torch.equal(lengths, first_stop) and torch.equal(gen.terminated, is_stop.any(1))  # pads end nothing
    with torch.no_grad():
        ref = PolicyModel(lm)(torch.cat([ids, gen.responses], 1), torch.cat([mask, gen.mask.long()], 1),
                              ids.shape[1])["logp"]
    assert float((gen.logprobs - ref).abs()[inside].max()) < 1e-5
