"""Diagnostics and settings of runs on a multi-turn environment: a group without learning signal is one
whose episode returns (every turn's reward) agree, not one whose last turns scored alike; and a
single-turn setting an environment would ignore is refused before any model loads."""

from __future__ import annotations

import pytest
import torch
from trainer_helpers import tiny_config

from ppo_lm.cli.main import main
from ppo_lm.config.validate import validate_config
from ppo_lm.rollout.score.batch import RolloutBatch
from ppo_lm.runtime.errors import ConfigError
from ppo_lm.trainer.diagnostics import rollout_metrics
from ppo_lm.trainer.ppo import PPOTrainer

TWO_TURNS = '''
class TwoTurns:
    """Turn 1 earns the parity of its characters' codes, turn 2 always 1.0: every last score is equal,
    the returns are not."""

    def reset(self, row, seed):
        self.prompt, self.turn = row["prompt"], 0
        return self.prompt

    def step(self, text):
        self.turn += 1
        if self.turn == 1:
            return "no\\n" + self.prompt, float(sum(map(ord, text)) % 2), False
        return None, 1.0, True
'''


def _two_turn_batch(first_turn: list[float], last: list[float]) -> RolloutBatch:
    """Episodes of two 2-token turns around a 1-token observation: the first turn's reward on its last
    token (a step reward), the last turn's as the score."""
    B, T = len(last), 5
    action = torch.tensor([[True, True, False, True, True]] * B)
    steps = torch.zeros(B, T)
    steps[:, 1] = torch.tensor(first_turn)
    zeros = torch.zeros(B, T)
    info = {"turns": torch.full((B,), 2), "observation_tokens": torch.ones(B, dtype=torch.long),
            "context_truncated": torch.zeros(B, dtype=torch.long)}
    return RolloutBatch(input_ids=torch.zeros(B, 2 + T, dtype=torch.long), attention_mask=torch.ones(B, 2 + T),
                        prompt_width=2, response_mask=torch.ones(B, T, dtype=torch.bool),
                        terminated=torch.ones(B, dtype=torch.bool), logp_old=zeros, logp_ref=zeros,
                        scores=torch.tensor(last), action_mask=action, episode_info=info, step_rewards=steps,
                        step_counts=torch.ones(B, dtype=torch.long))


def test_equal_groups_compare_episode_returns_not_last_scores():
    """Groups 0 and 2: last scores equal, returns 1 and 2, 0 and 0.5 (a signal). Group 1: last scores
    differ, returns both 1 (none). One of three groups carries no signal, not two."""
    batch = _two_turn_batch(first_turn=[0.0, 1.0, 0.5, 0.0, 0.0, 0.5], last=[1.0, 1.0, 0.5, 1.0, 0.0, 0.0])
    zeros = torch.zeros(6, 5)
    m = rollout_metrics(batch, zeros, zeros, None, beta=0.0, kl_estimator="k1", samples_per_prompt=2)
    assert m["equal_score_groups_frac"] == pytest.approx(1 / 3)
    assert m["reward_per_turn"] == pytest.approx(5.5 / 12)  # every turn's reward over 12 turns


def test_a_run_on_an_environment_counts_groups_by_their_returns(tmp_path):
    f = tmp_path / "two_turns.py"
    f.write_text(TWO_TURNS)
    cfg = tiny_config(tmp_path / "run", rollout__env=f"{f}:TwoTurns", rollout__max_turns=2,
                      rollout__num_prompts=4, rollout__samples_per_prompt=4, algo__estimator="grpo")
    tr = PPOTrainer(cfg)
    torch.manual_seed(0)
    batch = tr.rollout(1)
    m = tr.learn(batch, 1).metrics
    assert bool((batch.scores == 1.0).all())  # the last turns alone would say: no group has a signal
    returns = (batch.scores + batch.step_rewards.where(batch.loss_mask, 0).sum(1)).view(-1, 4)
    expected = float((returns == returns[:, :1]).all(1).double().mean())
    assert expected < 1.0 and m["equal_score_groups_frac"] == pytest.approx(expected)


def test_missing_eos_penalty_with_an_environment_is_refused(tmp_path, capsys, no_model_loads):
    cfg = tiny_config(tmp_path / "run", rollout__env="builtin:equations_retry", rollout__missing_eos_penalty=0.5)
    with pytest.raises(ConfigError, match=r"`rollout.missing_eos_penalty`=0.5 has no effect with `rollout.env`"):
        validate_config(cfg)
    cfg.rollout.missing_eos_penalty = 0.0
    validate_config(cfg)
    assert main(["train", "--rollout.env", "builtin:equations_retry", "--rollout.missing-eos-penalty", "0.5",
                 "--output-dir", str(tmp_path / "cli")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("ppo-lm: error: `rollout.missing_eos_penalty`=0.5") and err.count("\n") == 1, err
    assert "leave it out (0) with an environment" in err
