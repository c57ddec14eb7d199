"""The producer (rollout/sample/producer.py), its trajectories (rollout/trajectory.py), the learner's scoring of
them (rollout/score/scoring.py) and the source the trainer takes them from (rollout/sources/source.py): single-turn
responses are one-turn episodes sampled exactly as the engine samples; every trajectory carries the
sampler's log-probabilities and the version that sampled it; scoring lays each record out as a naive
concatenation does, whatever the order of the records."""

from __future__ import annotations

import torch
from trainer_helpers import count_sevens, tiny_config

from ppo_lm.data.prompts import encode_prompts
from ppo_lm.rollout.sample.engine import TorchEngine
from ppo_lm.rollout.sample.producer import Producer
from ppo_lm.rollout.sample.sampling import SamplingParams
from ppo_lm.rollout.score.scoring import pack
from ppo_lm.rollout.sources.source import Request, SyncSource
from ppo_lm.rollout.trajectory import Trajectory, TrajectoryBatch
from ppo_lm.tasks.equations import build_tiny_policy, build_tokenizer, make_prompts
from ppo_lm.trainer.ppo import PPOTrainer


def _setup():
    tok = build_tokenizer()
    lm = build_tiny_policy(tok, seed=0, hidden_size=32)
    params = SamplingParams(max_new_tokens=6, temperature=1.0, stop_token_ids=(tok.eos_token_id,))
    return tok, TorchEngine(lm, pad_token_id=tok.pad_token_id), params


def test_a_single_turn_response_is_a_one_turn_episode_sampled_as_the_engine_samples():
    tok, engine, params = _setup()
    rows = make_prompts(5, seed=3)
    engine.update_weights(7)
    trajs = Producer(engine, tok).produce(rows, samples=2, sampling=params, generator=torch.Generator().manual_seed(1))
    expanded = [r for r in rows for _ in range(2)]
    ids, mask = encode_prompts(tok, [r["prompt"] for r in expanded])
    want = engine.generate(ids, mask, params, generator=torch.Generator().manual_seed(1), return_logprobs=True)
    assert len(trajs) == 10
    for i, t in enumerate(trajs):
        n = int(want.mask[i].sum())
        assert t.prompt_ids == tok(expanded[i]["prompt"])["input_ids"] and t.row is expanded[i]
        assert t.tokens == want.responses[i, :n].tolist() and t.actions == [True] * n
        assert t.logprobs == want.logprobs[i, :n].tolist()
        assert t.turn_ends == [n - 1] and t.rewards == [] and t.observation_tokens == 0
        assert t.terminated == bool(want.terminated[i]) and t.version == 7 and t.seed is None
    assert any(t.terminated for t in trajs) and not all(t.terminated for t in trajs)


def _random_trajectories(g: torch.Generator, n: int) -> list[Trajectory]:
    out = []
    for i in range(n):
        t = Trajectory([int(x) for x in torch.randint(3, 20, (int(torch.randint(1, 5, (1,), generator=g)),),
                                                      generator=g)], version=i % 3)
        for turn in range(int(torch.randint(1, 4, (1,), generator=g))):
            if turn:
                t.add_observation([int(x) for x in torch.randint(3, 20, (int(torch.randint(0, 3, (1,), generator=g)),),
                                                                 generator=g)])
            k = int(torch.randint(1, 4, (1,), generator=g))
            t.add_action([int(x) for x in torch.randint(3, 20, (k,), generator=g)], torch.randn(k, generator=g).tolist())
        out.append(t)
    return out


def test_pack_lays_out_each_record_as_a_naive_concatenation():
    g = torch.Generator().manual_seed(0)
    for _ in range(20):
        trajs = _random_trajectories(g, 6)
        p = pack(trajs, pad_token_id=0, device="cpu")
        P = p.prompt_width
        for i, t in enumerate(trajs):
            row = p.input_ids[i][p.attention_mask[i].bool()].tolist()
            assert row == t.prompt_ids + t.tokens
            assert p.input_ids[i, P - len(t.prompt_ids) : P].tolist() == t.prompt_ids  # prompts left-padded to P
            n = len(t.tokens)
            assert p.response_mask[i].tolist() == [True] * n + [False] * (p.response_mask.shape[1] - n)
            assert p.action_mask[i, :n].tolist() == t.actions and not p.action_mask[i, n:].any()
            assert torch.equal(p.logp_behaviour[i, :n], torch.tensor(t.logprobs))
            assert not p.logp_behaviour[i, n:].any() and not p.logp_behaviour[i, :n][~p.action_mask[i, :n]].any()
            assert int(p.versions[i]) == t.version


def test_scoring_does_not_depend_on_the_order_of_the_records(tmp_path):
    tr = PPOTrainer(tiny_config(tmp_path, rollout__num_prompts=8, rollout__max_new_tokens=6), verifier=count_sevens)
    taken = tr.source.take(1)
    order = torch.randperm(len(taken), generator=torch.Generator().manual_seed(5))
    shuffled = TrajectoryBatch([taken.trajectories[i] for i in order.tolist()], taken.group_size, taken.environment)
    a, b = tr.score(taken), tr.score(shuffled)
    assert torch.equal(a.scores[order], b.scores) and a.responses == [b.responses[j] for j in order.argsort().tolist()]
    width = min(a.response_mask.shape[1], b.response_mask.shape[1])
    for name in ("logp_old", "logp_ref", "values_old"):
        x, y = getattr(a, name)[order, :width], getattr(b, name)[:, :width]
        assert float((x - y).abs().max()) < 1e-5, name


def test_the_source_plays_the_plan_and_stamps_the_weights_version(tmp_path):
    kw = dict(iterations=2, rollout__num_prompts=4, rollout__max_new_tokens=3, rollout__samples_per_prompt=2)
    tr = PPOTrainer(tiny_config(tmp_path, **kw), verifier=count_sevens)
    taken = []
    score = tr.score
    tr.score = lambda trajectories: taken.append(trajectories) or score(trajectories)
    tr.train()
    assert [t.iteration for t in taken] == [1, 2] and all(t.group_size == 2 and not t.environment for t in taken)
    for k, t in enumerate(taken, 1):
        assert [x.row for x in t.trajectories] == [r for r in tr.plan.rows_for(k) for _ in range(2)]
        assert {x.version for x in t.trajectories} == {k - 1}  # on policy: sampled by the previous update

    source = SyncSource(tr.sampler.producer, lambda k: Request(tr.plan.rows_for(k)), samples=1, sampling=tr.sampler.sampling,
                        generator=torch.Generator().manual_seed(0))
    got = source.take(3)
    assert len(got) == 4 and got.iteration == 3 and {x.version for x in got.trajectories} == {2}


def test_episodes_carry_the_samplers_logprobs_which_can_be_logp_old(tmp_path):
    """An environment's episodes: the sampler's log-probabilities on the action tokens, 0 on the
    observations; with ``rollout.logp_from_sampler`` they are logp_old, within 1e-5 of a scoring forward."""
    cfg = tiny_config(tmp_path, rollout__env="builtin:equations_retry", rollout__max_turns=3, rollout__num_prompts=8,
                      rollout__samples_per_prompt=2, rollout__logp_from_sampler=True, rollout__max_new_tokens=6)
    tr = PPOTrainer(cfg)
    try:
        taken = tr.source.take(1)
        trajs = taken.trajectories
        assert taken.environment and any(t.turns > 1 for t in trajs)
        seeds = tr.plan.seeds_for(1)
        for i, t in enumerate(trajs):
            assert len(t.tokens) == len(t.actions) == len(t.logprobs) and len(t.rewards) == t.turns
            assert all(t.actions[e] for e in t.turn_ends) and t.seed == seeds[i // 2]
            assert all(lp == 0.0 for lp, a in zip(t.logprobs, t.actions) if not a)
            assert all(lp < 0 for lp, a in zip(t.logprobs, t.actions) if a)
        batch = tr.score(taken)
    finally:
        tr.source.close()
    assert torch.equal(batch.logp_old, batch.logp_behaviour.where(batch.action_mask, 0))
    with torch.no_grad():
        forward = tr.models.policy(batch.input_ids, batch.attention_mask, batch.prompt_width)["logp"]
    assert float((forward - batch.logp_old).abs()[batch.action_mask].max()) < 1e-5
