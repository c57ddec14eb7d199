"""Honest timing of asynchronous PPO (docs/async.md, "What the timings mean"): ``iteration_s`` is the
learner's wall clock from taking the batch to publishing its weights — a wait at the publish included —
so the rates on it add up to the run's elapsed time, however slow the producer; the producer's own
seconds of sampling and of waiting for weights are reported per iteration, and the sampling rate is on
the producer's clock."""

from __future__ import annotations

import time

import pytest
from trainer_helpers import count_sevens, tiny_config

from ppo_lm.trainer.ppo import PPOTrainer

SLOW = 0.4  # seconds the producer spends on each batch beyond decoding (as an environment that waits)


class SlowPlan:
    def __init__(self, plan):
        self.plan = plan

    def __call__(self, iteration: int):
        time.sleep(SLOW)
        return self.plan(iteration)


@pytest.mark.slow  # ~8 s: .ci/run runs it
def test_rates_add_up_to_the_wall_clock_with_a_slow_producer(tmp_path):
    cfg = tiny_config(tmp_path, iterations=8, rollout__max_staleness=2, algo__off_policy_correction="tis",
                      rollout__num_prompts=8, rollout__max_new_tokens=6, critic__warmup_iterations=0,
                      optim__epochs=1)
    tr = PPOTrainer(cfg, verifier=count_sevens)
    tr.source.plan = SlowPlan(tr.source.plan)
    history = tr.train()
    # from the end of iteration 1 to the end of the last: what the iterations' own clocks must account for
    wall = history[-1]["elapsed_s"] - history[0]["elapsed_s"]
    timed = sum(m["iteration_s"] for m in history[1:])
    assert timed >= 0.9 * wall, (timed, wall)  # before: the publish's wait for the producer was in no timer
    episodes = 8 * len(history[1:])
    assert episodes / sum(8 / m["episodes_per_s"] for m in history[1:]) <= 1.1 * episodes / wall
    assert sum(m["publish_s"] for m in history[1:]) > 0
    for m in history[1:]:
        assert m["producer_decode_s"] >= SLOW and m["producer_idle_s"] >= 0
        tokens = m["response_length_mean"] * 8
        assert m["rollout_tokens_per_s"] == pytest.approx(tokens / m["producer_decode_s"], rel=1e-3)
