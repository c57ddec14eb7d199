"""The ``auto`` learning rates and response limit, resolved by the policy's size (trainer/sizing.py):
the rules on their own, what a run of the built-in model and of a model past the bound resolves
(optimisers, sampling, banner), and that config.yaml keeps ``auto``."""

from __future__ import annotations

import pytest
import yaml
from trainer_helpers import tiny_config

from ppo_lm.trainer.config import TrainConfig
from ppo_lm.trainer.sizing import LARGE, LARGE_MODEL_PARAMETERS, SMALL, resolve_auto


def test_auto_resolves_by_parameter_count_and_leaves_given_values_alone():
    cfg = TrainConfig()
    small = resolve_auto(cfg, 140_000)
    assert (small.cfg.optim.actor_lr, small.cfg.optim.critic_lr, small.cfg.rollout.max_new_tokens) == (3e-4, 1e-3, 8)
    large = resolve_auto(cfg, LARGE_MODEL_PARAMETERS)
    assert (large.cfg.optim.actor_lr, large.cfg.optim.critic_lr, large.cfg.rollout.max_new_tokens) == (1e-6, 1e-5, 128)
    assert large.values == {"optim.actor_lr": 1e-6, "optim.critic_lr": 1e-5, "rollout.max_new_tokens": 128}
    assert "134.52 M parameters, ≥ 10 M: large model" in resolve_auto(cfg, 134_515_008).reason
    assert cfg.optim.actor_lr == "auto"  # the given config is not changed
    cfg.model.lora_r = 16  # adapters start at zero: ten times the rate
    assert resolve_auto(cfg, 10**8).cfg.optim.actor_lr == LARGE.actor_lr_lora == 1e-5
    assert resolve_auto(cfg, 10**5).cfg.optim.actor_lr == SMALL.actor_lr_lora
    cfg.optim.actor_lr, cfg.rollout.max_new_tokens = 2e-6, 32
    given = resolve_auto(cfg, 10**8)
    assert (given.cfg.optim.actor_lr, given.cfg.rollout.max_new_tokens) == (2e-6, 32)
    assert given.values == {"optim.critic_lr": 1e-5}


def test_an_auto_response_limit_leaves_half_the_context_and_respects_min_new_tokens():
    cfg = TrainConfig()
    assert resolve_auto(cfg, 10**8, context=128).cfg.rollout.max_new_tokens == 64
    assert resolve_auto(cfg, 10**8, context=4096).cfg.rollout.max_new_tokens == 128
    cfg.rollout.min_new_tokens = 16
    assert resolve_auto(cfg, 10**5).cfg.rollout.max_new_tokens == 16


def _optimiser_rates(trainer) -> tuple[float, float]:
    return (trainer.learner.actor_opt.param_groups[0]["lr"], trainer.learner.critic_opt.param_groups[0]["lr"])


def test_the_builtin_model_trains_with_the_small_rates_and_the_banner_says_so(tmp_path, capsys):
    from ppo_lm.trainer.ppo import PPOTrainer

    cfg = tiny_config(tmp_path / "run")
    cfg.optim.actor_lr = cfg.optim.critic_lr = cfg.rollout.max_new_tokens = "auto"
    trainer = PPOTrainer(cfg)
    assert _optimiser_rates(trainer) == (3e-4, 1e-3) and trainer.sampling.max_new_tokens == 8
    out = capsys.readouterr().out
    assert "auto      optim.actor_lr 3e-4 · optim.critic_lr 1e-3 · rollout.max_new_tokens 8 (policy of" in out
    assert "< 10 M: small model" in out
    trainer.train()
    saved = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    assert saved["optim"]["actor_lr"] == saved["optim"]["critic_lr"] == saved["rollout"]["max_new_tokens"] == "auto"


def test_a_model_past_the_bound_trains_with_the_large_rates(tmp_path, capsys):
    """A built-in-architecture model of 16.9 M parameters (random, so only the resolution is tested: the
    slow test on SmolLM2 checks that the rates keep a pretrained model near its reference)."""
    from ppo_lm.tasks.equations import build_tiny_policy, build_tokenizer
    from ppo_lm.trainer.ppo import PPOTrainer

    tok = build_tokenizer()
    lm = build_tiny_policy(tok, seed=0, hidden_size=512, num_layers=4, max_position_embeddings=64)
    assert sum(p.numel() for p in lm.parameters()) >= LARGE_MODEL_PARAMETERS
    cfg = tiny_config(tmp_path / "run", optim__actor_lr="auto", optim__critic_lr="auto",
                      rollout__max_new_tokens="auto", rollout__num_prompts=2, optim__num_minibatches=1,
                      optim__epochs=1)
    trainer = PPOTrainer(cfg, policy=lm, tokenizer=tok)
    assert _optimiser_rates(trainer) == (1e-6, 1e-5)
    assert trainer.sampling.max_new_tokens == 32  # half the 64-token context
    assert "large model" in capsys.readouterr().out


@pytest.mark.parametrize("value, message", [
    ("fast", "`optim.actor_lr` must be a number or 'auto', got 'fast'"),
    (-1.0, "`optim.actor_lr` must be a finite number > 0, got -1.0"),
])
def test_bad_rates_are_one_line_naming_the_field(tmp_path, value, message):
    from ppo_lm.runtime.errors import ConfigError
    from ppo_lm.trainer.config_io import from_dict
    from ppo_lm.trainer.validate import validate_config

    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        validate_config(from_dict(TrainConfig, {"optim": {"actor_lr": value}}))
