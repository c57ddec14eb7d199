"""Shared tiny settings for trainer tests (hidden 32, 2 layers, few prompts, short responses)."""

from __future__ import annotations

from ppo_lm.trainer.config import TrainConfig


def tiny_config(output_dir, **overrides) -> TrainConfig:
    cfg = TrainConfig(output_dir=str(output_dir), iterations=2, seed=0)
    cfg.model.builtin_hidden_size = 32
    cfg.data.builtin_num_prompts = 64
    cfg.rollout.num_prompts = 8
    cfg.rollout.max_new_tokens = 4
    cfg.optim.epochs = 2
    cfg.optim.num_minibatches = 2
    cfg.log.progress = False
    cfg.log.tensorboard = False
    cfg.log.save_every = 0
    for key, value in overrides.items():
        section, _, field = key.partition("__")
        if field:
            setattr(getattr(cfg, section), field, value)
        else:
            setattr(cfg, section, value)
    return cfg


def count_sevens(prompts, responses, **columns):
    """Toy reward a tiny model learns in seconds: the share of '7' characters in the response."""
    return [r.count("7") / 4 for r in responses]


def length_reward(prompts, responses, **columns):
    """Dense toy reward that varies across any sampled batch: the response length."""
    return [len(r) / 4 for r in responses]
