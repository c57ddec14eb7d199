"""GAE across turns (docs/algorithm.md §1.3): action tokens separated by observation spans, against a
naive per-episode loop written turn by turn from the definition, on random episodes with random
observation spans and terminated and truncated episodes mixed.

The reference: per episode, with its turns' action positions, V_next of an action token is V of the next
token of the same turn, at a turn's last token V of the next turn's first action token (the observation
span between is skipped), after the last turn 0 (terminated) or the bootstrap value (truncated);
δ = r + γ·V_next − V and Â_j = Σ_l (γλ)^l·δ_{j+l} over the episode's action tokens in order.
"""

from __future__ import annotations

import pytest
import torch
from algo_helpers import GARBAGE
from hypothesis import given, settings
from hypothesis import strategies as st

from ppo_lm.algorithms import (
    AdvantageInputs,
    AdvantageSettings,
    compact_tokens,
    compute_advantages,
    gae,
    has_holes,
    reinforce_pp_advantages,
)

F64 = torch.float64


def random_episodes(B: int, seed: int, max_turns: int = 3):
    """Episodes as turns of action positions in a (B, T) block: action runs of 1–4 tokens separated by
    observation spans of 1–3 tokens; a truncated episode may end on an observation span (cut after
    it). Returns (turns per row, mask, rewards, values, terminated, bootstrap) with garbage on every
    non-action position of rewards and values."""
    g = torch.Generator().manual_seed(seed)

    def rint(lo, hi):
        return int(torch.randint(lo, hi + 1, (), generator=g))

    rows, ends, terminated = [], [], []
    for _ in range(B):
        t, turns = 0, []
        n = rint(1, max_turns)
        for k in range(n):
            turns.append(list(range(t, t + rint(1, 4))))
            t = turns[-1][-1] + 1
            if k + 1 < n:
                t += rint(1, 3)  # the observation span before the next turn
        term = bool(torch.rand((), generator=g) < 0.5)
        if not term and torch.rand((), generator=g) < 0.5:
            t += rint(1, 3)  # truncated after an observation that got no answer
        rows.append(turns)
        ends.append(t)
        terminated.append(term)
    T = max(ends) + rint(0, 2)
    mask = torch.zeros(B, T, dtype=torch.bool)
    for i, turns in enumerate(rows):
        for turn in turns:
            mask[i, turn] = True
    rewards = torch.randn(B, T, generator=g, dtype=F64)
    values = torch.randn(B, T, generator=g, dtype=F64)
    for k, (i, t) in enumerate((~mask).nonzero().tolist()):
        rewards[i, t] = GARBAGE[k % len(GARBAGE)]
        values[i, t] = GARBAGE[(k + 3) % len(GARBAGE)]
    boot = torch.randn(B, generator=g, dtype=F64)
    return rows, mask, rewards, values, torch.tensor(terminated), boot


def naive_gae(rows, rewards, values, terminated, boot, gamma, lam):
    adv = torch.zeros_like(rewards)
    for i, turns in enumerate(rows):
        deltas, positions = [], []
        for k, turn in enumerate(turns):
            for j, t in enumerate(turn):
                if j + 1 < len(turn):
                    v_next = float(values[i, turn[j + 1]])
                elif k + 1 < len(turns):
                    v_next = float(values[i, turns[k + 1][0]])  # skips the observation span
                else:
                    v_next = 0.0 if bool(terminated[i]) else float(boot[i])
                deltas.append(float(rewards[i, t]) + gamma * v_next - float(values[i, t]))
                positions.append(t)
        for a, t in enumerate(positions):
            adv[i, t] = sum((gamma * lam) ** k * deltas[a + k] for k in range(len(deltas) - a))
    return adv


@settings(max_examples=60, deadline=None)
@given(B=st.integers(1, 6), seed=st.integers(0, 2**31 - 1), gamma=st.floats(0.0, 1.0), lam=st.floats(0.0, 1.0))
def test_gae_across_turns_matches_the_naive_loop(B, seed, gamma, lam):
    rows, mask, rewards, values, terminated, boot = random_episodes(B, seed)
    x = AdvantageInputs(rewards=rewards, mask=mask, scores=torch.zeros(B, dtype=F64), terminated=terminated,
                        values=values, bootstrap_values=boot)
    adv, ret = compute_advantages("gae", x, AdvantageSettings(gamma=gamma, lam=lam))
    want = naive_gae(rows, rewards, values, terminated, boot, gamma, lam)
    torch.testing.assert_close(adv, want, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(ret, (want + values.where(mask, 0)).where(mask, 0), rtol=1e-9, atol=1e-9)
    assert bool((adv[~mask] == 0).all()) and bool((ret[~mask] == 0).all())


def test_the_random_episodes_have_holes_and_both_endings():
    rows, mask, _, _, terminated, _ = random_episodes(32, 0)
    assert has_holes(mask) and terminated.any() and (~terminated).any()
    assert any(len(turns) == 3 for turns in rows)


@pytest.mark.parametrize("seed", range(5))
def test_observation_spans_do_not_change_the_action_tokens_credit(seed):
    """Metamorphic: a single-turn batch spread over a wider block with holes between its tokens has the
    advantages and returns of the contiguous batch at the same tokens, for GAE with a critic λ and
    for REINFORCE++ (the whitening is over the action tokens alone)."""
    g = torch.Generator().manual_seed(seed)
    B, T = 5, 7
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    mask = torch.arange(T) < lengths[:, None]
    rewards, values = torch.randn(B, T, generator=g, dtype=F64), torch.randn(B, T, generator=g, dtype=F64)
    terminated, boot = torch.rand(B, generator=g) < 0.5, torch.randn(B, generator=g, dtype=F64)
    gaps = torch.randint(0, 3, (B, T), generator=g)
    pos = (torch.arange(T) + gaps.cumsum(1))  # where token t of each row goes in the wide block
    W = int(pos.max()) + 1
    wide = lambda x: torch.full((B, W), float("nan"), dtype=F64).scatter(1, pos, x)  # noqa: E731
    wide_mask = torch.zeros(B, W, dtype=torch.bool).scatter(1, pos, mask)
    assert has_holes(wide_mask)
    s = AdvantageSettings(gamma=0.9, lam=0.8, critic_lam=1.0)
    for name in ("gae", "reinforce++"):
        narrow = AdvantageInputs(rewards=rewards, mask=mask, scores=torch.zeros(B, dtype=F64), terminated=terminated,
                                 values=values, bootstrap_values=boot)
        spread = AdvantageInputs(rewards=wide(rewards), mask=wide_mask, scores=torch.zeros(B, dtype=F64),
                                 terminated=terminated, values=wide(values), bootstrap_values=boot)
        a1, r1 = compute_advantages(name, narrow, s)
        a2, r2 = compute_advantages(name, spread, s)
        torch.testing.assert_close(a2.gather(1, pos).where(mask, 0), a1, rtol=1e-12, atol=1e-12)
        assert bool((a2[~wide_mask] == 0).all())
        if r1 is not None:
            torch.testing.assert_close(r2.gather(1, pos).where(mask, 0), r1, rtol=1e-12, atol=1e-12)


def test_group_estimators_put_the_advantage_on_action_tokens_only():
    _, mask, rewards, _, terminated, _ = random_episodes(4, 3)
    scores = torch.tensor([1.0, 0.0, 0.5, 0.5], dtype=F64)
    x = AdvantageInputs(rewards=rewards, mask=mask, scores=scores, terminated=terminated, group_size=2)
    adv, ret = compute_advantages("rloo", x)
    want = torch.tensor([1.0, -1.0, 0.0, 0.0], dtype=F64)[:, None].expand_as(mask).where(mask, 0)
    assert ret is None and torch.equal(adv, want)


def test_a_right_padded_mask_runs_the_estimator_as_it_is():
    """Single-turn is the special case: bit-identical to calling the estimator's function."""
    g = torch.Generator().manual_seed(1)
    B, T = 6, 9
    mask = torch.arange(T) < torch.randint(1, T + 1, (B,), generator=g)[:, None]
    r, v = torch.randn(B, T, generator=g), torch.randn(B, T, generator=g)
    term, boot = torch.rand(B, generator=g) < 0.5, torch.randn(B, generator=g)
    x = AdvantageInputs(rewards=r, mask=mask, scores=torch.zeros(B), terminated=term, values=v, bootstrap_values=boot)
    adv, ret = compute_advantages("gae", x, AdvantageSettings(gamma=1.0, lam=0.95))
    want_adv, want_ret = gae(r, v, mask, gamma=1.0, lam=0.95, terminated=term, bootstrap_values=boot)
    assert torch.equal(adv, want_adv) and torch.equal(ret, want_ret)
    assert torch.equal(compute_advantages("reinforce++", x)[0], reinforce_pp_advantages(r, mask))


def test_compaction_round_trips():
    _, mask, rewards, _, _, _ = random_episodes(8, 5)
    c = compact_tokens(mask)
    assert not has_holes(c.mask) and torch.equal(c.mask.sum(1), mask.sum(1))
    x = rewards.where(mask, 0)
    assert torch.equal(c.scatter(c.gather(x).where(c.mask, 0)), x)
    # order keeps the action tokens in order
    for i in range(8):
        kept = c.order[i, : int(mask[i].sum())]
        assert torch.equal(kept, mask[i].nonzero().squeeze(1))


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_masked_sums_take_holes_as_the_compacted_tokens(agg):
    """The losses and statistics are masked sums: on a mask with holes they equal the same functions on
    the compacted tokens (seq-mean-token-sum-norm with the same horizon T)."""
    from ppo_lm.algorithms import explained_variance, policy_loss, value_loss, whiten

    _, mask, rewards, values, _, _ = random_episodes(6, 11)
    c = compact_tokens(mask)
    g = torch.Generator().manual_seed(2)
    logp_old = torch.randn(mask.shape, generator=g, dtype=F64) - 1
    logp = logp_old + 0.3 * torch.randn(mask.shape, generator=g, dtype=F64)
    adv = rewards.where(mask, 0)
    ret = values.where(mask, 0) + 0.5
    kw = dict(clip_eps=0.2, agg=agg)
    holes, _ = policy_loss(logp, logp_old, adv, mask, **kw)
    packed, _ = policy_loss(c.gather(logp), c.gather(logp_old), c.gather(adv), c.mask, **kw)
    torch.testing.assert_close(holes, packed, rtol=1e-12, atol=1e-12)
    vh, _ = value_loss(values.where(mask, 0), values.where(mask, 0) - 0.1, ret, mask, clip_eps=0.2, agg=agg)
    vp, _ = value_loss(c.gather(values.where(mask, 0)), c.gather(values.where(mask, 0) - 0.1), c.gather(ret), c.mask,
                       clip_eps=0.2, agg=agg)
    torch.testing.assert_close(vh, vp, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(c.gather(whiten(adv, mask)).where(c.mask, 0), whiten(c.gather(adv), c.mask))
    torch.testing.assert_close(explained_variance(values, ret, mask), explained_variance(c.gather(values), c.gather(ret), c.mask))


def test_the_score_lands_on_the_last_action_token():
    from ppo_lm.algorithms import shape_rewards

    rows, mask, _, _, _, _ = random_episodes(8, 4)
    B, T = mask.shape
    zeros = torch.zeros(B, T, dtype=F64)
    scores = torch.arange(1.0, B + 1, dtype=F64)
    out = shape_rewards(scores, zeros, zeros, mask, kl_coef=0.1)
    for i, turns in enumerate(rows):
        want = torch.zeros(T, dtype=F64)
        want[turns[-1][-1]] = scores[i]
        assert torch.equal(out[i], want)
