"""Built-in tasks that run offline; see docs/algorithm.md §5."""

from .equations import (
    PROMPT_TEMPLATE,
    RESPONSE_TEMPLATE,
    EquationTaskConfig,
    build_tiny_policy,
    build_tokenizer,
    format_equation,
    make_prompts,
    parse_equation,
    preference_pairs,
    sft_demonstrations,
    solve_equation,
    split_of,
    tiny_model_config,
    verify,
)

__all__ = [
    "PROMPT_TEMPLATE",
    "RESPONSE_TEMPLATE",
    "EquationTaskConfig",
    "build_tiny_policy",
    "build_tokenizer",
    "format_equation",
    "make_prompts",
    "parse_equation",
    "preference_pairs",
    "sft_demonstrations",
    "solve_equation",
    "split_of",
    "tiny_model_config",
    "verify",
]
