"""Supervised fine-tuning of the initial policy on (prompt, response) demonstrations.

Loss is next-token cross-entropy on response tokens only (the response text plus EOS), averaged over
response tokens of the batch. Prompt positions carry label -100: the policy is conditioned on prompts,
never trained to produce them, which is also all PPO will ask of it. Works with any HF causal LM and
tokenizer; the built-in task uses it to make an imperfect starting policy (docs/algorithm.md §5).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F

from ..data.examples import (
    check_chat_template,
    encode_prompt_response,
    load_sft_rows,
    naming,
    pad_sequences,
    split_rows,
)
from ..data.rows import InputError, RowsLike
from ._common import (
    StageConfig,
    batch_indices,
    check_stage_config,
    make_optimizer,
    make_scheduler,
    model_device,
    optimizer_step,
    save_artifacts,
    total_steps,
    window_log_entry,
)

logger = logging.getLogger(__name__)

IGNORE_INDEX = -100


@dataclass
class SFTConfig(StageConfig):
    """Settings of the SFT stage (train_sft): the fields of :class:`~._common.StageConfig`, an example
    being a (prompt, response) row. max_steps, when set, overrides epochs."""


def build_sft_example(
    tokenizer, prompt: str | list[dict], response: str | list[dict], add_special_tokens: bool = True
) -> tuple[list[int], list[int]]:
    """``(input_ids, labels)`` of equal length: prompt positions labelled -100, response + EOS kept.

    ``prompt`` is text or chat messages (rendered by the chat template, see
    :func:`~ppo_lm.data.examples.encode_prompt_response`); ``response`` text or one assistant message."""
    prompt_ids, response_ids = encode_prompt_response(tokenizer, prompt, response, add_special_tokens)
    return prompt_ids + response_ids, [IGNORE_INDEX] * len(prompt_ids) + response_ids


def collate_sft(examples: Sequence[tuple[list[int], list[int]]], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-padded ``input_ids``, ``attention_mask``, ``labels``, each ``(B, T_max)``.

    Right padding keeps positions 0..len-1 for every row, as in plain training; padded labels are -100.
    """
    input_ids, attention_mask = pad_sequences([e[0] for e in examples], pad_id, side="right")
    labels, _ = pad_sequences([e[1] for e in examples], pad_id, side="right", fill=IGNORE_INDEX)
    return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}


def sft_loss(model, batch: dict[str, torch.Tensor], reduction: str = "mean") -> tuple[torch.Tensor, int]:
    """Response-token cross-entropy of ``batch``; returns ``(loss, n_tokens)``.

    ``reduction="mean"`` averages over labelled tokens, ``"sum"`` sums (for exact held-out means
    across batches). Logits at position t predict token t+1, hence the shift.
    """
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    targets = batch["labels"][:, 1:]
    n_tokens = int((targets != IGNORE_INDEX).sum())
    loss = F.cross_entropy(
        logits[:, :-1].reshape(-1, logits.shape[-1]).float(),
        targets.reshape(-1),
        ignore_index=IGNORE_INDEX,
        reduction="sum",
    )
    if reduction == "mean":
        loss = loss / max(n_tokens, 1)
    return loss, n_tokens


@torch.no_grad()
def evaluate_sft_loss(model, examples, pad_id: int, batch_size: int) -> float:
    """Mean response-token NLL over ``examples`` (token-weighted across batches); nan if empty."""
    if not examples:
        return float("nan")
    was_training = model.training
    model.eval()
    device = model_device(model)
    total, count = 0.0, 0
    for start in range(0, len(examples), batch_size):
        batch = collate_sft(examples[start : start + batch_size], pad_id)
        batch = {k: v.to(device) for k, v in batch.items()}
        loss, n = sft_loss(model, batch, reduction="sum")
        total += float(loss)
        count += n
    model.train(was_training)
    return total / max(count, 1)


def _encode_rows(tokenizer, rows, cfg: SFTConfig):
    examples, skipped = [], 0
    for row in rows:
        ids, labels = build_sft_example(tokenizer, row["prompt"], row["response"], cfg.add_special_tokens)
        if len(ids) > cfg.max_length:
            skipped += 1
            continue
        examples.append((ids, labels))
    return examples, skipped


def _fit_sft(model, train_ex, pad_id: int, cfg: SFTConfig, n_steps: int, seed: int, log_fn) -> tuple[list[float], int]:
    """The SFT loop: response-token NLL per batch; per-step losses and the response tokens trained on."""
    device = model_device(model)
    opt = make_optimizer(model, cfg.lr, cfg.weight_decay)
    sched = make_scheduler(opt, cfg.schedule, cfg.warmup_steps, n_steps)
    model.train()
    losses: list[float] = []
    tokens = 0
    t0 = time.perf_counter()
    for step, idx in enumerate(batch_indices(len(train_ex), cfg.batch_size, n_steps, seed), start=1):
        batch = {k: v.to(device) for k, v in collate_sft([train_ex[i] for i in idx], pad_id).items()}
        loss, n_tok = sft_loss(model, batch)
        grad_norm = optimizer_step(model, opt, sched, loss, cfg.max_grad_norm, what="SFT", step=step)
        losses.append(loss.item())
        tokens += n_tok
        entry = window_log_entry("sft", step, n_steps, cfg.log_every, sched, grad_norm, loss=losses)
        if entry is not None:
            entry["tokens_per_s"] = tokens / max(time.perf_counter() - t0, 1e-9)
            logger.info("sft step %d/%d loss %.4f", step, n_steps, entry["loss"])
            if log_fn is not None:
                log_fn(entry)
    return losses, tokens


def train_sft(
    model,
    tokenizer,
    rows: RowsLike,
    cfg: SFTConfig | None = None,
    output_dir=None,
    eval_rows: RowsLike | None = None,
    log_fn: Callable[[dict], None] | None = None,
    seed: int = 0,
) -> dict:
    """Fine-tune ``model`` in place on ``rows`` (columns ``prompt``, ``response``); returns metrics.

    ``rows`` is anything :func:`~ppo_lm.data.examples.load_sft_rows` accepts: ``prompt`` text or chat
    messages (rendered with the tokenizer's chat template), ``response`` text or one assistant message,
    or a ``messages`` conversation ending with the assistant turn to train on. Held-out rows are ``eval_rows``
    if given, else a seeded ``heldout_fraction`` of ``rows``. ``seed`` decides the held-out split, the
    batch order and torch's RNG (dropout). ``log_fn`` gets a dict every ``log_every`` steps. With ``output_dir`` the model and tokenizer are ``save_pretrained`` there,
    with ``sft_metrics.json``. The model's train/eval mode is restored on return.

    Metrics: ``train_loss`` (per step), ``heldout_loss_before``/``after`` (response-token NLL),
    ``steps``, ``n_train``, ``n_heldout``, ``n_skipped_too_long``, ``train_tokens``, ``wall_time_s``.
    """
    cfg = cfg or SFTConfig()
    check_stage_config(cfg, "sft")
    rows = load_sft_rows(rows, name="sft data")
    check_chat_template(tokenizer, rows, "sft data")
    if eval_rows is not None:
        train_rows, held_rows = rows, load_sft_rows(eval_rows, name="sft eval data")
        check_chat_template(tokenizer, held_rows, "sft eval data")
    else:
        train_rows, held_rows = split_rows(rows, cfg.heldout_fraction, seed)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id

    with naming("sft data"):
        train_ex, skipped = _encode_rows(tokenizer, train_rows, cfg)
    with naming("sft data" if eval_rows is None else "sft eval data"):
        held_ex, held_skipped = _encode_rows(tokenizer, held_rows, cfg)
    if not train_ex:
        raise InputError(f"all {len(train_rows)} SFT rows are longer than max_length={cfg.max_length}")
    n_steps = total_steps(len(train_ex), cfg.batch_size, cfg.epochs, cfg.max_steps)

    was_training = model.training
    torch.manual_seed(seed)  # dropout, if the model has any
    heldout_before = evaluate_sft_loss(model, held_ex, pad_id, cfg.eval_batch_size)

    t0 = time.perf_counter()
    losses, tokens = _fit_sft(model, train_ex, pad_id, cfg, n_steps, seed, log_fn)
    wall = time.perf_counter() - t0

    heldout_after = evaluate_sft_loss(model, held_ex, pad_id, cfg.eval_batch_size)
    model.train(was_training)
    metrics = {
        "train_loss": losses,
        "heldout_loss_before": heldout_before,
        "heldout_loss_after": heldout_after,
        "steps": n_steps,
        "n_train": len(train_ex),
        "n_heldout": len(held_ex),
        "n_skipped_too_long": skipped + held_skipped,
        "train_tokens": tokens,
        "wall_time_s": wall,
        "seed": seed,
        "config": asdict(cfg),
    }
    if output_dir is not None:
        save_artifacts(output_dir, model, tokenizer, metrics, "sft_metrics.json")
    return metrics
