"""Sequence packing (models/packing.py): every real token placed once, and the packed forward gives
the padded forward's log-probs, values, scores and gradients."""

from __future__ import annotations

import torch
from test_perf_equivalence import P, T, _batch, _model, _reference_logp

from ppo_lm.models import actor_critic
from ppo_lm.models.actor_critic import CriticModel, PolicyModel, sequence_scores
from ppo_lm.models.logprobs import position_ids_from_mask
from ppo_lm.models.packing import plan_packing


def _skewed_mask(B=12, L=40, seed=0):
    """Left-padded prompts and right-padded responses of very different lengths."""
    g = torch.Generator().manual_seed(seed)
    mask = torch.zeros(B, L, dtype=torch.long)
    for b in range(B):
        pad = int(torch.randint(0, 6, (1,), generator=g))
        resp = int(torch.randint(1, L - 10, (1,), generator=g)) if b else L - 10  # one full-length row
        mask[b, pad : 10 + resp] = 1
    return mask


def test_plan_places_every_real_token_once():
    mask = _skewed_mask()
    plan = plan_packing(mask)
    assert plan is not None and plan.rows * plan.capacity <= 0.8 * mask.numel()
    assert plan.capacity % 16 == 0 or plan.capacity == mask.shape[1]
    slots = set(zip(plan.dst_r.tolist(), plan.dst_c.tolist()))
    assert len(slots) == int(mask.sum())  # no two tokens share a slot
    assert int(plan.dst_c.max()) < plan.capacity and int(plan.dst_r.max()) < plan.rows
    assert torch.equal(plan.positions, position_ids_from_mask(mask)[mask.bool()])
    ids = torch.arange(mask.numel()).view(mask.shape)
    packed, pos, seg = plan.pack(ids, fill=-1)
    full = plan.keep(0)  # every slot
    restored = full.unpack(packed.gather(1, full.index).unsqueeze(-1).float()).squeeze(-1).long()
    assert torch.equal(restored[mask.bool()], ids[mask.bool()])
    for b in range(mask.shape[0]):  # a sequence is contiguous in one row, positions 0 … n−1
        r, c = (seg == b).nonzero(as_tuple=True)
        assert len(set(r.tolist())) == 1 and torch.equal(c, torch.arange(c[0], c[0] + len(c)))
        assert torch.equal(pos[r, c], torch.arange(len(c)))


def test_no_plan_when_packing_saves_little():
    assert plan_packing(torch.ones(8, 32, dtype=torch.long)) is None
    assert plan_packing(torch.ones(1, 32, dtype=torch.long)) is None
    mostly_full = torch.ones(8, 32, dtype=torch.long)
    mostly_full[0, 20:] = 0
    assert plan_packing(mostly_full) is None


def _outputs(lm, critic, ids, mask, weights):
    lm.zero_grad()
    critic.zero_grad()
    logp = PolicyModel(lm)(ids, mask, P, with_entropy=True)["logp"]
    values = critic(ids, mask, P)
    ((logp * weights).sum() + (values[:, :-1] * weights).sum()).backward()
    scores = sequence_scores(critic.model, ids, mask, P + mask[:, P:].sum(1) - 1)  # at the last token
    grads = [p.grad.clone() for p in list(lm.parameters()) + list(critic.parameters())]
    return logp.detach(), values.detach(), scores.detach(), grads


def test_packed_forward_equals_padded_forward(monkeypatch):
    lm, critic = _model("qwen2", 2), CriticModel(_model("qwen2", 2, kind=2))
    ids, mask = _batch()  # 4 rows, left-padded prompts, responses of 7, 3, 1, 5 tokens
    assert plan_packing(mask) is not None, "the test batch must be packable"
    resp = mask[:, P:].bool()
    weights = torch.randn(4, T, generator=torch.Generator().manual_seed(2)).where(resp, 0)
    packed = _outputs(lm, critic, ids, mask, weights)
    monkeypatch.setattr(actor_critic, "PACKING", False)
    padded = _outputs(lm, critic, ids, mask, weights)
    assert float((packed[0] - padded[0]).abs()[resp].max()) < 1e-5
    vmask = torch.arange(T + 1)[None, :] <= resp.sum(1, keepdim=True)  # V(x_t), t = 0 … length
    assert float((packed[1] - padded[1]).abs()[vmask].max()) < 1e-5
    assert float((packed[2] - padded[2]).abs().max()) < 1e-5
    for a, b in zip(packed[3], padded[3]):
        assert float((a - b).abs().max()) <= 1e-5 + 1e-4 * float(b.abs().max())
    # and both equal the plain transformers forward
    with torch.no_grad():
        ref = _reference_logp(lm, ids, mask)
    assert float((packed[0] - ref).abs()[resp].max()) < 1e-5


def test_keep_selects_the_positions_a_caller_reads():
    mask = _skewed_mask()
    plan = plan_packing(mask)
    ids = torch.arange(mask.numel()).view(mask.shape)
    packed, _, _ = plan.pack(ids, fill=-1)
    for keep_from in (0, 9, 20):
        kept = plan.keep(keep_from)
        picked = packed.gather(1, kept.index).unsqueeze(-1).float()
        out = kept.unpack(picked).squeeze(-1).long()  # (B, L − keep_from)
        real = mask.bool()[:, keep_from:]
        assert torch.equal(out[real], ids[:, keep_from:][real])
        assert int(kept.index.shape[1]) == int(real.sum(1).max()) or keep_from == 0


@torch.no_grad()
def test_lean_keep_index_equals_full_forward_at_those_positions():
    from ppo_lm.models import lean

    body = _model("qwen2", 2).model
    ids, mask = _batch()
    ones = torch.ones_like(mask)
    pick = torch.tensor([[12, 3, 7], [0, 5, 5], [6, 6, 11], [1, 2, 3]])
    cases = [{}, {"segment_ids": (torch.arange(13) >= 6).long().expand(4, -1).contiguous(),
                  "position_ids": torch.cat([torch.arange(6), torch.arange(7)]).expand(4, -1)}]
    for kw in cases:  # the plain causal mask, and two packed segments per row
        ref = lean.forward_hidden(body, ids, ones, **kw)
        got = lean.forward_hidden(body, ids, ones, keep_index=pick, **kw)
        assert float((got - ref.gather(1, pick[..., None].expand(-1, -1, ref.shape[-1]))).abs().max()) < 1e-5
