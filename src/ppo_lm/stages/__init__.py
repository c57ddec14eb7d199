"""Training stages before PPO: supervised fine-tuning and reward-model training, plus data loading."""

from .data import (
    encode_prompt_response,
    last_token_index,
    pad_sequences,
    position_ids_from_mask,
    split_rows,
)
from .rm import (
    RMConfig,
    build_reward_model_from_policy_config,
    evaluate_pairs,
    normalize_reward_model,
    score_sequences,
    score_texts,
    train_reward_model,
)
from .rows import load_rows
from .sft import SFTConfig, build_sft_example, collate_sft, evaluate_sft_loss, sft_loss, train_sft

__all__ = [
    "RMConfig",
    "SFTConfig",
    "build_reward_model_from_policy_config",
    "build_sft_example",
    "collate_sft",
    "encode_prompt_response",
    "evaluate_pairs",
    "evaluate_sft_loss",
    "last_token_index",
    "load_rows",
    "normalize_reward_model",
    "pad_sequences",
    "position_ids_from_mask",
    "score_sequences",
    "score_texts",
    "sft_loss",
    "split_rows",
    "train_reward_model",
    "train_sft",
]
