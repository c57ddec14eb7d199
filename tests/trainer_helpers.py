"""Shared tiny settings for trainer tests (hidden 32, 2 layers, few prompts, short responses)."""

from __future__ import annotations

from contextlib import contextmanager

from ppo_lm.algorithms.registry import ADVANTAGE_ESTIMATORS
from ppo_lm.config.train import TrainConfig


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
    cfg = with_overrides(cfg, overrides)
    spec = ADVANTAGE_ESTIMATORS.get(cfg.algo.estimator)  # an unknown name is some tests' subject
    if "critic__kind" not in overrides and spec is not None and spec.needs_critic:
        # the trainer tests were written for a separate critic, which `auto` gives only a large policy
        cfg.critic.kind = "separate"
    return cfg


def with_overrides(cfg, overrides: dict):
    """``cfg`` with ``section__field=value`` (or top-level ``field=value``) settings applied."""
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


def bpe_tokenizer(corpus: list[str], vocab_size: int = 300, chat_template: str | None = None):
    """A byte-level BPE tokenizer trained here on ``corpus`` (multi-byte characters span several
    tokens); with ``chat_template``, ChatML special tokens (`<|im_start|>`, `<|im_end|>` = EOS) and
    that template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<|im_start|>", "<|im_end|>"] if chat_template else []
    tok.train_from_iterator(corpus * 20, trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials,
                                                             initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    if not chat_template:
        return PreTrainedTokenizerFast(tokenizer_object=tok)
    t = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|im_start|>")
    t.chat_template = chat_template
    return t


def action_runs(batch, i):
    """Row i's response as runs of action and of observation tokens: [(is_action, [ids]), …] in order."""
    ids = batch.input_ids[i, batch.prompt_width:][batch.response_mask[i]].tolist()
    act = batch.action_mask[i][batch.response_mask[i]].tolist()
    runs = []
    for t, a in zip(ids, act):
        if runs and runs[-1][0] == a:
            runs[-1][1].append(t)
        else:
            runs.append((a, [t]))
    return runs


@contextmanager
def other_weights(saved_policy, scratch):
    """``saved_policy``'s directory holding another tiny model's weights (same path, same shapes) inside
    the block, its own again after it."""
    from ppo_lm.tasks.equations import build_tiny_policy, build_tokenizer

    weights = saved_policy / "model.safetensors"
    original = weights.read_bytes()
    build_tiny_policy(build_tokenizer(), seed=5, hidden_size=32).save_pretrained(scratch)
    weights.write_bytes((scratch / "model.safetensors").read_bytes())
    try:
        yield
    finally:
        weights.write_bytes(original)
