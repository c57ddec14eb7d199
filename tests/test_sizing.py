"""The ``auto`` learning rates, response limit and micro-batches, resolved by the policy's size (config/sizing.py):
the rules on their own, what a run of the built-in model and of a model past the bound resolves
(optimisers, sampling, banner), and that config.yaml keeps ``auto``."""

from __future__ import annotations

import pytest
import yaml
from trainer_helpers import tiny_config

from ppo_lm.config import sizing
from ppo_lm.config.sizing import BILLION_PARAMETERS, LARGE, LARGE_MODEL_PARAMETERS, SMALL, resolve_auto
from ppo_lm.config.train import TrainConfig


def test_auto_resolves_by_parameter_count_and_leaves_given_values_alone():
    cfg = TrainConfig()
    small = resolve_auto(cfg, 140_000)
    assert (small.cfg.optim.actor_lr, small.cfg.critic.lr, small.cfg.rollout.max_new_tokens) == (3e-4, 1e-3, 8)
    assert small.cfg.algo.bootstrap_truncated is True
    assert small.cfg.critic.kind == "shared" and small.values["critic.kind"] == "shared"
    large = resolve_auto(cfg, LARGE_MODEL_PARAMETERS)
    assert (large.cfg.optim.actor_lr, large.cfg.critic.lr, large.cfg.rollout.max_new_tokens) == (1e-6, 1e-4, 128)
    assert large.cfg.algo.bootstrap_truncated is False
    assert large.values == {"optim.actor_lr": 1e-6, "critic.lr": 1e-4, "rollout.max_new_tokens": 128,
                            "algo.bootstrap_truncated": False, "critic.kind": "shared"}
    assert "134.52 M parameters, ≥ 10 M: large model" in resolve_auto(cfg, 134_515_008).reason
    billion = resolve_auto(cfg, BILLION_PARAMETERS)
    assert (billion.cfg.critic.lr, billion.cfg.algo.bootstrap_truncated) == (1e-5, False)
    assert billion.cfg.critic.kind == "separate"  # unmeasured at that size: the peers' separate critic
    assert billion.cfg.optim.actor_lr == LARGE.actor_lr
    assert "1.00 B parameters, ≥ 1 B: billion-scale model" in billion.reason
    assert resolve_auto(cfg, BILLION_PARAMETERS - 1).cfg.critic.lr == 1e-4
    assert cfg.optim.actor_lr == "auto" and cfg.algo.bootstrap_truncated == "auto"  # the given config is not changed
    cfg.model.lora_r = 16  # adapters start at zero: ten times the rate
    assert resolve_auto(cfg, 10**8).cfg.optim.actor_lr == LARGE.actor_lr_lora == 1e-5
    assert resolve_auto(cfg, 10**5).cfg.optim.actor_lr == SMALL.actor_lr_lora
    cfg.optim.actor_lr, cfg.rollout.max_new_tokens, cfg.algo.bootstrap_truncated = 2e-6, 32, True
    cfg.critic.kind = "frozen"
    given = resolve_auto(cfg, 10**8)
    assert (given.cfg.optim.actor_lr, given.cfg.rollout.max_new_tokens) == (2e-6, 32)
    assert given.cfg.algo.bootstrap_truncated is True and given.cfg.critic.kind == "frozen"
    assert given.values == {"critic.lr": 1e-4}


def test_an_environments_episodes_take_the_separate_critic_at_every_size(tmp_path):
    cfg = TrainConfig()
    cfg.rollout.env = "builtin:equations_retry"
    for parameters in (140_000, 10**8, BILLION_PARAMETERS):
        got = resolve_auto(cfg, parameters)
        assert got.cfg.critic.kind == got.values["critic.kind"] == "separate"
    assert resolve_auto(cfg, 10**8).reason.endswith("; separate critic: an environment's episodes")
    assert "environment" not in resolve_auto(cfg, BILLION_PARAMETERS).reason  # separate there anyway
    cfg.algo.estimator = "reinforce++"  # no critic: nothing said about one
    assert "environment" not in resolve_auto(cfg, 10**8).reason
    from ppo_lm.config.unused import unused_settings

    given = tiny_config(tmp_path, rollout__env="builtin:equations_retry", critic__kind="auto",
                        critic__value_grad_scale=0.5)
    found = {u.field: u for u in unused_settings(given)}
    assert found["critic.value_grad_scale"].refused
    assert "'auto' resolves to 'separate' with `rollout.env`" in found["critic.value_grad_scale"].message


def test_a_critic_free_run_resolves_the_critics_settings_without_listing_them():
    """GRPO has no critic: its banner does not list a critic rate or the bootstrap, though both resolve."""
    cfg = TrainConfig()
    cfg.algo.estimator = "grpo"
    got = resolve_auto(cfg, 10**8)
    assert set(got.values) == {"optim.actor_lr", "rollout.max_new_tokens"}
    assert (got.cfg.critic.lr, got.cfg.algo.bootstrap_truncated) == (1e-4, False)


def test_an_auto_response_limit_leaves_half_the_context_and_respects_min_new_tokens():
    cfg = TrainConfig()
    assert resolve_auto(cfg, 10**8, context=128).cfg.rollout.max_new_tokens == 64
    assert resolve_auto(cfg, 10**8, context=4096).cfg.rollout.max_new_tokens == 128
    cfg.rollout.min_new_tokens = 16
    assert resolve_auto(cfg, 10**5).cfg.rollout.max_new_tokens == 16


def _optimiser_rates(trainer) -> tuple[float, float]:
    return (trainer.training.learner.actor_opt.param_groups[0]["lr"], trainer.training.learner.critic_opt.param_groups[0]["lr"])


def test_the_builtin_model_trains_with_the_small_rates_and_the_banner_says_so(tmp_path, capsys):
    from ppo_lm.trainer.ppo import PPOTrainer

    cfg = tiny_config(tmp_path / "run")
    cfg.optim.actor_lr = cfg.critic.lr = cfg.rollout.max_new_tokens = "auto"
    trainer = PPOTrainer(cfg)
    assert _optimiser_rates(trainer) == (3e-4, 1e-3) and trainer.sampler.sampling.max_new_tokens == 8
    out = capsys.readouterr().out
    assert ("auto      optim.actor_lr 3e-4 · critic.lr 1e-3 · rollout.max_new_tokens 8 · "
            "algo.bootstrap_truncated true · optim.micro_batch_size 0 (policy of") in out
    assert "< 10 M: small model" in out
    trainer.train()
    saved = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    assert saved["optim"]["actor_lr"] == saved["critic"]["lr"] == saved["rollout"]["max_new_tokens"] == "auto"
    assert saved["optim"]["micro_batch_size"] == saved["algo"]["bootstrap_truncated"] == "auto"


def test_a_model_past_the_bound_trains_with_the_large_rates(tmp_path, capsys):
    """A built-in-architecture model of 16.9 M parameters (random, so only the resolution is tested: the
    slow test on SmolLM2 checks that the rates keep a pretrained model near its reference)."""
    from ppo_lm.tasks.equations import build_tiny_policy, build_tokenizer
    from ppo_lm.trainer.ppo import PPOTrainer

    tok = build_tokenizer()
    lm = build_tiny_policy(tok, seed=0, hidden_size=512, num_layers=4, max_position_embeddings=64)
    assert sum(p.numel() for p in lm.parameters()) >= LARGE_MODEL_PARAMETERS
    cfg = tiny_config(tmp_path / "run", optim__actor_lr="auto", critic__lr="auto",
                      rollout__max_new_tokens="auto", rollout__num_prompts=2, optim__num_minibatches=1,
                      optim__epochs=1)
    trainer = PPOTrainer(cfg, policy=lm, tokenizer=tok)
    assert _optimiser_rates(trainer) == (1e-6, 1e-4)
    assert trainer.sampler.sampling.max_new_tokens == 32  # half the 64-token context
    assert trainer.cfg.algo.bootstrap_truncated is False
    out = capsys.readouterr().out
    assert "critic.lr 1e-4 · rollout.max_new_tokens 32 · algo.bootstrap_truncated false" in out
    assert "large model" in out


@pytest.mark.parametrize("value, message", [
    ("fast", "`optim.actor_lr` must be a number or 'auto', got 'fast'"),
    (-1.0, "`optim.actor_lr` must be a finite number > 0, got -1.0"),
])
def test_bad_rates_are_one_line_naming_the_field(tmp_path, value, message):
    from ppo_lm.config.io import from_dict
    from ppo_lm.config.validate import validate_config
    from ppo_lm.runtime.errors import ConfigError

    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        validate_config(from_dict(TrainConfig, {"optim": {"actor_lr": value}}))


MIB = 2**20


def _micro(cfg: TrainConfig, parameters: int, *, rows: int, per_row_mib: float, state_mib: float) -> sizing.Resolved:
    return sizing.resolve_micro_batch(resolve_auto(cfg, parameters), minibatch_rows=rows, tokens_per_row=1,
                                      bytes_per_token=int(per_row_mib * MIB), state=int(state_mib * MIB))


def test_auto_micro_batches_keep_a_lora_runs_activations_within_a_third_of_its_state():
    """Against the rule written out: with LoRA on a large model, the largest divisor d of the minibatch
    with d × per-row activations ≤ state / 3; the whole minibatch (0) when it fits, for full
    fine-tuning, for any small model, and a given value as it is."""
    cfg = TrainConfig()
    cfg.model.lora_r = 16
    for rows in (1, 6, 8, 12, 16, 30):
        for per_row in (10.0, 85.8, 300.0, 5000.0):
            for state in (1174.0, 5130.0):
                got = _micro(cfg, 10**8, rows=rows, per_row_mib=per_row, state_mib=state)
                fits = [d for d in range(1, rows + 1) if rows % d == 0 and d * per_row <= state / 3]
                want = 0 if rows * per_row <= state / 3 else max(fits, default=1)
                assert got.cfg.optim.micro_batch_size == want, (rows, per_row, state)
                assert got.values["optim.micro_batch_size"] == want
                if want:
                    assert rows % want == 0
    # W3's shapes: LoRA (two bodies' weights and small adapters) splits 8 rows into 4s
    assert _micro(cfg, 134_515_008, rows=8, per_row_mib=85.8, state_mib=1174).cfg.optim.micro_batch_size == 4
    assert _micro(cfg, 140_000, rows=8, per_row_mib=5000, state_mib=1).cfg.optim.micro_batch_size == 0
    cfg.model.lora_r = 0  # full fine-tuning: whole minibatches whatever the estimate
    assert _micro(cfg, 134_515_008, rows=8, per_row_mib=5000, state_mib=1).values["optim.micro_batch_size"] == 0
    cfg.model.lora_r = 16
    cfg.optim.micro_batch_size = 2
    given = _micro(cfg, 10**8, rows=8, per_row_mib=5000, state_mib=1)
    assert given.cfg.optim.micro_batch_size == 2 and "optim.micro_batch_size" not in given.values


def test_the_activation_estimate_is_nine_hidden_and_three_intermediate_vectors_per_token_and_layer():
    from types import SimpleNamespace

    llama = SimpleNamespace(hidden_size=576, num_hidden_layers=30, intermediate_size=1536)
    assert sizing.activation_bytes_per_token(llama) == 30 * (9 * 576 + 3 * 1536) * 4
    gpt2 = SimpleNamespace(n_embd=64, n_layer=2, n_inner=None)
    assert sizing.activation_bytes_per_token(gpt2, 2) == 2 * (9 * 64 + 3 * 256) * 2


def test_the_state_counts_each_storage_once_and_three_more_copies_of_what_trains():
    import torch

    body = torch.nn.Linear(10, 10, bias=False)
    body.weight.requires_grad_(False)
    head = torch.nn.Linear(10, 1, bias=False)
    shared = torch.nn.Module()
    shared.body, shared.head = body, head  # a second model on the same body
    assert sizing.state_bytes([body, shared], [head.weight]) == 100 * 4 + 10 * 4 + 10 * (4 + 8)


def test_a_lora_run_of_a_model_past_the_bound_micro_batches_and_says_so(tmp_path, capsys):
    """The trainer resolves auto from its own models: a 16.9 M-parameter policy with LoRA adapters and
    32-row minibatches splits them; with full fine-tuning (three times as much state per trained
    parameter) the same rows stay whole."""
    from ppo_lm.tasks.equations import build_tiny_policy, build_tokenizer
    from ppo_lm.trainer.ppo import PPOTrainer

    tok = build_tokenizer()
    runs = {}
    for lora in (0, 4):
        lm = build_tiny_policy(tok, seed=0, hidden_size=512, num_layers=4, max_position_embeddings=64)
        cfg = tiny_config(tmp_path / f"run{lora}", rollout__max_new_tokens=8, rollout__num_prompts=32,
                          optim__num_minibatches=1, optim__epochs=1, model__lora_r=lora)
        cfg.optim.micro_batch_size = "auto"
        trainer = PPOTrainer(cfg, policy=lm, tokenizer=tok)
        runs[lora] = trainer.cfg.optim.micro_batch_size
        out = capsys.readouterr().out
        assert f"optim.micro_batch_size {runs[lora]} " in out
        assert ("a third of the models and their state (LoRA)" in out) == bool(lora)
    assert runs[0] == 0 and 0 < runs[4] < 32 and 32 % runs[4] == 0, runs


@pytest.mark.parametrize("value, message", [
    ("fast", "`optim.micro_batch_size` must be an integer or 'auto', got 'fast'"),
    (-1, "`optim.micro_batch_size` must be >= 0, got -1"),
])
def test_a_bad_micro_batch_size_is_one_line_naming_the_field(value, message):
    from ppo_lm.config.io import from_dict
    from ppo_lm.config.validate import validate_config
    from ppo_lm.runtime.errors import ConfigError

    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        validate_config(from_dict(TrainConfig, {"optim": {"micro_batch_size": value}}))


@pytest.mark.parametrize("flag, saved", [("2", "micro_batch_size: 2"), ("auto", "micro_batch_size: auto")])
def test_the_micro_batch_flag_takes_a_number_or_auto(tmp_path, flag, saved):
    from ppo_lm.cli.main import main

    p = tmp_path / "c.yaml"
    p.write_text("iterations: 1\nmodel:\n  builtin_hidden_size: 32\nrollout:\n  num_prompts: 4\n  max_new_tokens: 3\n"
                 "optim:\n  epochs: 1\nlog:\n  progress: false\n  tensorboard: false\n")
    out = tmp_path / "run"
    assert main(["train", "--config", str(p), "--output-dir", str(out), "--optim.micro-batch-size", flag]) == 0
    assert saved in (out / "config.yaml").read_text()
