"""One optimiser and schedule factory (ppo_lm.runtime.optim) for PPO's actor and critic, SFT and the
reward model: weight decay spares 1-D parameters, and the warm-up's first step already moves the weights."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn
from trainer_helpers import length_reward, tiny_config

from ppo_lm.runtime import optim
from ppo_lm.stages._common import make_optimizer, make_scheduler
from ppo_lm.trainer.ppo import PPOTrainer


def _model():
    return nn.Sequential(nn.Linear(3, 4), nn.LayerNorm(4), nn.Linear(4, 1))


def test_weight_decay_spares_biases_and_norm_weights():
    m = _model()
    opt = optim.adamw(m.parameters(), 1e-3, weight_decay=0.1)
    decayed = {id(p) for g in opt.param_groups if g["weight_decay"] == 0.1 for p in g["params"]}
    assert decayed == {id(m[0].weight), id(m[2].weight)}
    assert sum(len(g["params"]) for g in opt.param_groups) == len(list(m.parameters()))
    # without decay one group, as the optimiser state of checkpoints written before holds it
    assert len(optim.adamw(m.parameters(), 1e-3).param_groups) == 1


@pytest.mark.parametrize("schedule", ["constant", "linear", "cosine"])
def test_the_schedule_warms_up_from_the_first_step_then_decays_to_zero(schedule):
    warmup, total = 4, 10
    factors = [optim.lr_factor(k, schedule, warmup, total) for k in range(total + 1)]
    assert factors[:warmup] == pytest.approx([0.25, 0.5, 0.75, 1.0])
    assert factors[warmup] == pytest.approx(1.0)
    if schedule == "constant":
        assert factors[-1] == 1.0
    else:
        assert factors[total] == pytest.approx(0.0, abs=1e-12)
        mid = (warmup + total) // 2
        want = 0.5 if schedule == "linear" else 0.5 * (1 + math.cos(math.pi * 0.5))
        assert factors[mid] == pytest.approx(want)


def test_the_stages_and_ppo_share_the_schedule(tmp_path):
    """SFT's optimiser and schedule are the factory's; PPO's actor steps at (k+1)/warmup of its rate
    from the first step (the schedule PPO used before started at 0, wasting a step)."""
    m = _model()
    opt = make_optimizer(m, 1e-2, weight_decay=0.1)
    sched = make_scheduler(opt, "linear", 2, 6)
    lrs = []
    for _ in range(6):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert lrs == pytest.approx([1e-2 * optim.lr_factor(k, "linear", 2, 6) for k in range(6)])
    assert len(opt.param_groups) == 2

    cfg = tiny_config(tmp_path, iterations=1, optim__epochs=1, optim__num_minibatches=2, optim__warmup_steps=4,
                      optim__actor_lr=1e-3, optim__weight_decay=0.01)
    tr = PPOTrainer(cfg, verifier=length_reward)
    assert tr.train_iteration(1).metrics["lr_actor"] == pytest.approx(1e-3 * 2 / 4)  # its 2nd step: (1+1)/4
    groups = tr.training.learner.actor_opt.param_groups
    assert {g["weight_decay"] for g in groups} == {0.01, 0.0}
    assert all(p.ndim < 2 for g in groups if g["weight_decay"] == 0.0 for p in g["params"])
    assert isinstance(tr.training.learner.actor_sched, torch.optim.lr_scheduler.LambdaLR)
