"""CPU lanes (``ppo_lm.runtime.lanes``): independent work side by side on threads, same results as one at a time."""

from __future__ import annotations

import threading
import time

import pytest
import torch
from torch import nn
from trainer_helpers import length_reward, tiny_config

from ppo_lm.runtime import lanes as lanes_module
from ppo_lm.runtime.lanes import Lanes, resolve_lanes
from ppo_lm.trainer.ppo import PPOTrainer


@pytest.fixture(autouse=True)
def _split_tiny_work(monkeypatch):
    """The tiny test models are far below the share size at which lanes pay; split them anyway."""
    monkeypatch.setattr(lanes_module, "MIN_SHARE_ELEMENTS", 1)


def test_run_keeps_order_splits_threads_and_restores_them():
    torch.set_num_threads(2)
    lanes = Lanes(2)
    seen = []

    def task(i):
        def run():
            seen.append((i, threading.get_ident(), torch.get_num_threads()))
            time.sleep(0.05)  # overlap: the other task starts meanwhile
            return i * 10
        return run

    assert lanes.run([task(0), task(1)]) == [0, 10]
    assert {s[2] for s in seen} == {1}  # each lane has half of the two threads
    assert len({s[1] for s in seen}) == 2  # on two threads
    assert any(s[0] == 0 and s[1] == threading.get_ident() for s in seen)  # the first on the caller's
    assert torch.get_num_threads() == 2
    torch.set_num_threads(4)  # changed after the lanes were built: shares follow, and it is restored
    seen.clear()
    lanes.run([task(0), task(1)])
    assert {s[2] for s in seen} == {2} and torch.get_num_threads() == 4
    with pytest.raises(ValueError, match="3 tasks for 2 lanes"):
        lanes.run([task(0), task(1), task(2)])
    lanes.close()


def test_a_failing_task_raises_after_the_others_finish():
    torch.set_num_threads(2)
    lanes = Lanes(2)
    done = []

    def slow():
        time.sleep(0.2)
        done.append(True)

    def bad():
        raise RuntimeError("boom")

    for tasks in ([slow, bad], [bad, slow]):
        done.clear()
        with pytest.raises(RuntimeError, match="boom"):
            lanes.run(tasks)
        assert done == [True]  # nothing still running when the error surfaces
        assert torch.get_num_threads() == 2


def test_fewer_threads_than_tasks_runs_them_in_turn():
    torch.set_num_threads(2)
    lanes = Lanes(2)
    torch.set_num_threads(1)
    ident = []
    assert lanes.run([lambda: ident.append(threading.get_ident()) or 1, lambda: ident.append(threading.get_ident()) or 2]) == [1, 2]
    assert ident == [threading.get_ident()] * 2 and torch.get_num_threads() == 1


def test_accumulate_sums_lanes_into_fresh_gradients():
    """autograd may return one tensor for two parameters, or a broadcast view: ``.grad`` must own
    its memory, or later in-place accumulation would leak into the other parameter."""
    from ppo_lm.runtime.lanes import accumulate

    a, b = torch.nn.Parameter(torch.zeros(3)), torch.nn.Parameter(torch.zeros(3))
    shared = torch.tensor([0.0, 1.0, 2.0])
    accumulate([a, b], [(shared, shared)])  # one lane handed the same tensor to both
    accumulate([a, b], [(shared, None), (shared, None)])  # a second micro-batch, two lanes
    assert a.grad.tolist() == [0.0, 3.0, 6.0] and b.grad.tolist() == [0.0, 1.0, 2.0]
    c = torch.nn.Parameter(torch.zeros(2, 3))
    accumulate([c], [(torch.ones(1, 3).expand(2, 3),)])  # a broadcast (stride-0) view
    accumulate([c], [(torch.ones(2, 3),)])
    assert c.grad.tolist() == [[2.0] * 3] * 2


def test_merge_shares_means_and_maxima():
    from ppo_lm.algorithms import StatsAggregator, UpdateStats

    # losses count by their units (here sequences: 1 and 3), other statistics by tokens (10 and 10)
    agg = StatsAggregator()
    agg.add(UpdateStats(policy_loss=1.0, ratio_max=1.5, approx_kl=0.1), units=1.0, tokens=10.0)
    agg.add(UpdateStats(policy_loss=4.0, ratio_max=1.2, approx_kl=0.3), units=3.0, tokens=10.0)
    stats = agg.result().as_dict()
    assert stats == {"policy_loss": pytest.approx(3.25), "ratio_max": 1.5, "approx_kl": pytest.approx(0.2)}


def test_split_keeps_shares_big_enough(monkeypatch):
    monkeypatch.setattr(lanes_module, "MIN_SHARE_ELEMENTS", 1000)
    lanes = Lanes(2, threads=2)
    assert lanes.split(rows=10, tokens_per_row=10, hidden=20) == 2  # 2000 elements: two shares of 1000
    assert lanes.split(rows=10, tokens_per_row=10, hidden=19) == 1
    assert lanes.split(rows=1, tokens_per_row=10**6, hidden=64) == 1  # one row cannot be shared
    assert Lanes(1).split(rows=10**3, tokens_per_row=10**3, hidden=10**3) == 1


def test_one_lane_runs_inline_and_resolution_rules():
    ident = []
    assert Lanes(1).run([lambda: ident.append(threading.get_ident()) or 1, lambda: 2]) == [1, 2]
    assert ident == [threading.get_ident()]
    torch.set_num_threads(2)
    assert resolve_lanes(2, torch.device("cpu"), distributed=False) == 2
    assert resolve_lanes(4, torch.device("cpu"), distributed=False) == 2  # not more lanes than threads
    assert resolve_lanes(2, torch.device("cpu"), distributed=True) == 1
    assert resolve_lanes(2, torch.device("cuda"), distributed=False) == 1


def test_big_trained_models_keep_one_lane(monkeypatch):
    """Each extra lane holds a copy of every trained gradient: above MAX_LANE_GRADIENT_BYTES of them a
    run with ``cpu_lanes`` 0 (auto) keeps one lane; frozen parameters and a shared parameter count once."""
    torch.set_num_threads(2)
    policy, critic = nn.Linear(10, 10), nn.Linear(10, 10)  # 110 parameters each: 440 bytes
    frozen = nn.Linear(100, 100).requires_grad_(False)
    assert lanes_module.gradient_bytes(policy, critic, frozen, None) == 880
    assert lanes_module.gradient_bytes(policy, policy) == 440
    cpu = torch.device("cpu")
    monkeypatch.setattr(lanes_module, "MAX_LANE_GRADIENT_BYTES", 880)
    assert lanes_module.lanes_for(0, cpu, False, policy, critic).lanes == 2  # 0 = auto
    monkeypatch.setattr(lanes_module, "MAX_LANE_GRADIENT_BYTES", 879)
    assert lanes_module.lanes_for(0, cpu, False, policy, critic).lanes == 1
    assert lanes_module.lanes_for(0, cpu, False, policy).lanes == 2
    assert lanes_module.lanes_for(2, cpu, False, policy, critic).lanes == 2  # an explicit count is honoured


def _trainer(tmp_path, lanes, **overrides):
    cfg = tiny_config(tmp_path / f"lanes{lanes}", threads=2, rollout__num_prompts=16, rollout__max_new_tokens=12,
                      optim__epochs=2, optim__num_minibatches=2, model__cpu_lanes=lanes, **overrides)
    cfg.rollout.stop_tokens = list("0123456789")  # varied lengths
    return PPOTrainer(cfg, verifier=None if "model__reward" in overrides else length_reward)


def _weights(tr):
    out = {f"p.{k}": v.detach().clone() for k, v in tr.models.policy.state_dict().items()}
    if tr.models.critic is not None:
        out |= {f"c.{k}": v.detach().clone() for k, v in tr.models.critic.state_dict().items()}
    return out


@pytest.mark.parametrize("overrides", [
    {},  # separate critic: policy and critic each split over the lanes
    {"critic__kind": "shared"},
    {"algo__estimator": "grpo", "rollout__samples_per_prompt": 2, "algo__kl_in": "loss"},
    {"optim__micro_batch_size": 4, "algo__entropy_coef": 0.01},
])
def test_update_with_two_lanes_equals_one_lane(tmp_path, overrides):
    """Each lane back-propagates its share of the rows; summed, the gradients are the micro-batch's,
    so the updated weights and the logged statistics match the one-lane update."""
    one, two = _trainer(tmp_path, 1, **overrides), _trainer(tmp_path, 2, **overrides)
    assert (one.training.learner.lanes.lanes, two.training.learner.lanes.lanes) == (1, 2)
    batch = one.rollout(1)
    assert batch.lengths.min() < batch.lengths.max()
    m1, m2 = one.learn(batch, 1).metrics, two.learn(batch, 1).metrics
    w1, w2 = _weights(one), _weights(two)
    assert not all(torch.equal(w1[k], w) for k, w in _weights(_trainer(tmp_path / "init", 1, **overrides)).items())
    for k in w1:
        assert torch.allclose(w1[k], w2[k], atol=1e-5, rtol=0), k
    for k in ("policy_loss", "value_loss", "approx_kl", "entropy", "policy_clip_frac", "grad_norm_actor",
              "ratio_max"):
        if k in m1:
            assert m2[k] == pytest.approx(m1[k], rel=1e-4, abs=1e-6), k


@pytest.mark.parametrize("critic,reward_model", [("separate", False), ("shared", False), ("separate", True)])
def test_scoring_with_two_lanes_equals_one_lane(tmp_path, critic, reward_model):
    """Each lane runs every scoring model (policy, critic, reference, reward model) on its rows."""
    extra = {"critic__kind": critic}
    if reward_model:
        from dist_worker import save_reward_model

        extra["model__reward"] = save_reward_model(str(tmp_path / "rm"))
    one, two = _trainer(tmp_path, 1, **extra), _trainer(tmp_path, 2, **extra)
    assert any(term.model is not None for term in one.models.rewards) == reward_model
    b1, b2 = one.rollout(1), two.rollout(1)
    assert torch.equal(b1.input_ids, b2.input_ids)  # same samples: scoring is what differs
    for name in ("logp_old", "logp_ref", "values_old", "bootstrap_values", "scores"):
        assert torch.allclose(getattr(b1, name), getattr(b2, name), atol=1e-5, rtol=0), name


def test_gradient_checkpointing_keeps_one_lane(tmp_path, monkeypatch):
    """Checkpointed models back-propagate with .backward() on one lane (autograd.grad would not do),
    and checkpointing really runs in the update (transformers needs training mode for it)."""
    from ppo_lm.trainer import roles

    cfg = tiny_config(tmp_path, threads=2, model__cpu_lanes=2)
    policy = roles.build_policy(cfg, roles.build_tokenizer(cfg.model))
    enable = getattr(policy, "activation_checkpointing_enable", None) or policy.gradient_checkpointing_enable
    enable()  # (transformers 5 renamed it)
    calls = []
    for m in policy.modules():  # count the checkpoint calls each layer makes
        real = vars(m).get("_gradient_checkpointing_func")
        if real is not None:
            monkeypatch.setattr(m, "_gradient_checkpointing_func",
                                lambda *a, _real=real, **k: calls.append(1) or _real(*a, **k), raising=False)
    tr = PPOTrainer(cfg, policy=policy, verifier=length_reward)
    assert tr.training.learner.lanes.lanes == 1
    assert _trainer(tmp_path, 2).training.learner.lanes.lanes == 2
    tr.train_iteration(1)
    assert calls
    assert not tr.models.policy.lm.training  # back in eval mode for the next rollout


@pytest.mark.parametrize("arch,rates", [("starcoder2", {"residual_dropout": 0.3, "embedding_dropout": 0.3}),
                                        ("bloom", {"hidden_dropout": 0.3}), ("biogpt", {"layerdrop": 0.5})])
def test_checkpointed_update_computes_what_the_rollout_did(tmp_path, arch, rates):
    """With checkpointing the update runs layers in training mode; dropout rates that layers read from
    their own attributes or the config must stay off, so the first step's ratio is exactly 1."""
    import transformers

    from ppo_lm.trainer import roles

    cfg = tiny_config(tmp_path, threads=1, iterations=1, optim__epochs=1, optim__num_minibatches=1)
    tok = roles.build_tokenizer(cfg.model)
    config = transformers.AutoConfig.for_model(
        arch, vocab_size=len(tok), hidden_size=32, n_embed=32, num_hidden_layers=2, n_layer=2, num_attention_heads=4,
        n_head=4, num_key_value_heads=4, intermediate_size=64, max_position_embeddings=128,
        pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, bos_token_id=tok.bos_token_id, **rates)
    torch.manual_seed(0)
    lm = transformers.AutoModelForCausalLM.from_config(config)
    lm.gradient_checkpointing_enable()
    metrics = PPOTrainer(cfg, policy=lm, tokenizer=tok, verifier=length_reward).train_iteration(1).metrics
    assert metrics["approx_kl"] == 0.0 and metrics["ratio_max"] == 1.0
    assert all(getattr(lm.config, k) == v for k, v in rates.items())  # the config is given back as it was


def test_a_lane_run_nested_in_a_worker_runs_in_order():
    """A worker's task that calls Lanes.run again must not wait on the pool it occupies."""
    import threading

    torch.set_num_threads(4)
    lanes = Lanes(2)
    done = {}

    def outer(name):
        def task():
            return lanes.run([lambda: f"{name}-a", lambda: f"{name}-b"])
        return task

    t = threading.Thread(target=lambda: done.setdefault("r", lanes.run([outer("x"), outer("y")])), daemon=True)
    t.start()
    t.join(timeout=20)
    assert done.get("r") == [["x-a", "x-b"], ["y-a", "y-b"]]
    lanes.close()
