"""The chunked log-prob (``ppo_lm.models.logprobs``) against the unchunked expression it replaces:
same values and gradients, on random batches with masked (padded) positions, in every dtype."""

from __future__ import annotations

import pytest
import torch

from ppo_lm.models import logprobs
from ppo_lm.models.logprobs import gather_logprobs


def _reference(logits, labels):
    if logits.dtype in (torch.float16, torch.bfloat16):
        logits = logits.float()
    return logits.gather(-1, labels.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, dim=-1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("chunk", [1 << 22, 1000, 1])  # one chunk, a few rows per chunk, one row
def test_chunked_logprobs_equal_the_unchunked_expression(monkeypatch, dtype, chunk):
    monkeypatch.setattr(logprobs, "CHUNK_ELEMENTS", chunk)
    g = torch.Generator().manual_seed(0)
    logits = (torch.randn(4, 7, 301, generator=g) * 4).to(dtype)
    logits[1, 3, :150] = float("-inf")  # filtered entries, as top-k leaves them
    labels = torch.randint(150, 301, (4, 7), generator=g)
    mask = torch.rand(4, 7, generator=g) > 0.3  # padded positions: their log-probs are multiplied by 0
    weights = torch.randn(4, 7, generator=g, dtype=torch.float64 if dtype == torch.float64 else torch.float32)

    ours_x = logits.clone().requires_grad_()
    ours = gather_logprobs(ours_x, labels)
    (ours * weights * mask).sum().backward()
    ref_x = logits.clone().requires_grad_()
    ref = _reference(ref_x, labels)
    (ref * weights * mask).sum().backward()

    assert ours.dtype == ref.dtype and ours.shape == ref.shape
    assert torch.equal(ours, ref)
    assert torch.equal(ours_x.grad, ref_x.grad)
    with torch.no_grad():  # the no-grad path (scoring, sampling) too
        assert torch.equal(gather_logprobs(logits, labels), ref.detach())


def test_chunks_cover_every_row_once():
    rows = [list(range(s.start, s.stop)) for s in logprobs._chunks(10, 3 * 2**20)]
    assert sum(rows, []) == list(range(10)) and all(rows)
    assert [list(range(s.start, s.stop)) for s in logprobs._chunks(3, 1 << 30)] == [[0], [1], [2]]
