"""Training stages before PPO: supervised fine-tuning and reward-model training (their data: :mod:`ppo_lm.data`)."""

from .rm import (
    RMConfig,
    build_reward_model_from_policy_config,
    evaluate_pairs,
    normalize_reward_model,
    score_sequences,
    score_texts,
    train_reward_model,
)
from .sft import SFTConfig, build_sft_example, collate_sft, evaluate_sft_loss, sft_loss, train_sft

__all__ = [
    "RMConfig",
    "SFTConfig",
    "build_reward_model_from_policy_config",
    "build_sft_example",
    "collate_sft",
    "evaluate_pairs",
    "evaluate_sft_loss",
    "normalize_reward_model",
    "score_sequences",
    "score_texts",
    "sft_loss",
    "train_reward_model",
    "train_sft",
]
