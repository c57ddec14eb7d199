"""Bradley–Terry reward model: training on preference pairs and last-token scoring (docs/algorithm.md §2).

The model is any ``AutoModelForSequenceClassification`` with ``num_labels=1`` whose head is a
``score`` layer on top of ``model.base_model`` (Llama/Qwen2/Mistral/GPT-2 style). A sequence is
prompt + response + EOS and its score is the head's output at the last attended token, located from
the attention mask, so left and right padding give the same score and a pad token equal to EOS does
no harm.

Normalisation: after training, scores on a reference set are standardised with a mean and std stored
in ``model.config`` (``ppo_lm_reward_mean``/``ppo_lm_reward_std``), so they survive
``save_pretrained``; :func:`score_sequences` applies them. PPO's KL coefficient is then on a
predictable scale whatever the RM's raw offset.
"""

from __future__ import annotations

import copy
import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F

from ..data.examples import (
    check_chat_template,
    encode_prompt_response,
    last_token_index,
    load_preference_rows,
    load_sft_rows,
    naming,
    pad_sequences,
    split_rows,
)
from ..data.rows import InputError, RowsLike
from ..models.actor_critic import REWARD_MEAN_KEY, REWARD_STD_KEY, sequence_scores
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

MEAN_KEY = REWARD_MEAN_KEY
STD_KEY = REWARD_STD_KEY


@dataclass
class RMConfig(StageConfig):
    """Settings of the reward-model stage (train_reward_model): the fields of
    :class:`~._common.StageConfig`, an example being a (prompt, chosen, rejected) pair, and the
    normalisation. max_steps, when set, overrides epochs."""

    normalize: bool = True
    """After training, standardise the scores on the training pairs' responses (mean and std stored in
    the model's config.json), so PPO's KL coefficient sees a predictable scale."""


def build_reward_model_from_policy_config(
    config,
    causal_lm=None,
    pad_token_id: int | None = None,
    attn_implementation: str | None = None,
    seed: int | None = None,
):
    """A fresh ``AutoModelForSequenceClassification`` (``num_labels=1``) with ``config``'s architecture.

    With ``causal_lm`` its transformer body is copied in (``rm.base_model`` ← ``causal_lm.base_model``)
    and the dtype follows it; the scalar head stays freshly initialised. ``pad_token_id`` defaults to
    the config's, then to its EOS id (HF refuses batches without one, though scoring does not use it).
    ``seed`` makes the initialisation reproducible without touching the caller's global RNG.
    """
    from transformers import AutoModelForSequenceClassification

    cfg = copy.deepcopy(config)
    cfg.num_labels = 1
    cfg.architectures = None
    for key in (MEAN_KEY, STD_KEY):  # a stale normalisation must not carry over to a new head
        if hasattr(cfg, key):
            delattr(cfg, key)
    if pad_token_id is not None:
        cfg.pad_token_id = pad_token_id
    if getattr(cfg, "pad_token_id", None) is None:
        eos = getattr(cfg, "eos_token_id", None)
        cfg.pad_token_id = eos[0] if isinstance(eos, list) else eos
    kwargs = {}
    if attn_implementation is not None:
        kwargs["attn_implementation"] = attn_implementation
    if causal_lm is not None:
        kwargs["dtype"] = next(causal_lm.parameters()).dtype
    with torch.random.fork_rng(devices=[], enabled=seed is not None):
        if seed is not None:
            torch.manual_seed(seed)
        rm = AutoModelForSequenceClassification.from_config(cfg, **kwargs)
    if causal_lm is not None:
        rm.base_model.load_state_dict(causal_lm.base_model.state_dict())
        rm.to(model_device(causal_lm))
    return rm


def score_sequences(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, normalize: bool = True):
    """Scalar score of each sequence: ``(B, T)`` ids and mask (left or right padded) -> ``(B,)`` float32.

    Read at the last attended token. With ``normalize`` and a stored mean/std, returns
    ``(raw - mean) / std``. Keeps the caller's grad mode: wrap in ``torch.no_grad()`` for inference.
    """
    return sequence_scores(
        model, input_ids, attention_mask, last_token_index(attention_mask), normalize=normalize
    )


def encode_sequences(
    tokenizer, prompts: Sequence[str | list[dict]], responses: Sequence[str], add_special_tokens: bool = True
) -> list[list[int]]:
    """Token ids of prompt + response + EOS per row (tokenised separately; see ``encode_prompt_response``:
    a prompt may be chat messages, rendered with the chat template)."""
    out = []
    for p, r in zip(prompts, responses):
        p_ids, r_ids = encode_prompt_response(tokenizer, p, r, add_special_tokens)
        out.append(p_ids + r_ids)
    return out


@torch.no_grad()
def score_texts(
    model,
    tokenizer,
    prompts: Sequence[str | list[dict]],
    responses: Sequence[str],
    batch_size: int = 64,
    normalize: bool = True,
    add_special_tokens: bool = True,
) -> torch.Tensor:
    """Scores of ``prompts[i] + responses[i] + EOS``, shape ``(N,)``; eval mode during the call."""
    seqs = encode_sequences(tokenizer, prompts, responses, add_special_tokens)
    return _score_ids(model, seqs, _pad_id(tokenizer), batch_size, normalize)


def _pad_id(tokenizer) -> int:
    return tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id


@torch.no_grad()
def _score_ids(model, seqs, pad_id: int, batch_size: int, normalize: bool) -> torch.Tensor:
    was_training = model.training
    model.eval()
    device = model_device(model)
    parts = []
    for start in range(0, len(seqs), batch_size):
        ids, mask = pad_sequences(seqs[start : start + batch_size], pad_id, side="right")
        parts.append(score_sequences(model, ids.to(device), mask.to(device), normalize).cpu())
    model.train(was_training)
    return torch.cat(parts) if parts else torch.zeros(0)


def normalize_reward_model(
    model, tokenizer, prompts: Sequence[str | list[dict]], responses: Sequence[str], batch_size: int = 64, **kw
) -> tuple[float, float]:
    """Store mean/std of raw scores on ``(prompts, responses)`` in ``model.config``; returns them.

    Best computed on samples of the policy PPO will start from (the SFT model), so its scores start
    near mean 0, std 1.
    """
    raw = score_texts(model, tokenizer, prompts, responses, batch_size, normalize=False, **kw)
    mean = float(raw.mean())
    std = float(raw.std()) if raw.numel() > 1 else 1.0
    if not math.isfinite(std) or std < 1e-6:
        std = 1.0  # constant scores: centre only rather than blow them up
    setattr(model.config, MEAN_KEY, mean)
    setattr(model.config, STD_KEY, std)
    return mean, std


def _encode_pairs(tokenizer, rows, cfg: RMConfig):
    pairs, skipped = [], 0
    for row in rows:
        chosen, rejected = encode_sequences(
            tokenizer, [row["prompt"]] * 2, [row["chosen"], row["rejected"]], cfg.add_special_tokens
        )
        if max(len(chosen), len(rejected)) > cfg.max_length:
            skipped += 1
            continue
        pairs.append((chosen, rejected))
    return pairs, skipped


def _pair_scores(model, pairs, pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Raw ``(chosen, rejected)`` scores, each ``(B,)``: both sides in one padded forward pass."""
    ids, mask = pad_sequences([c for c, _ in pairs] + [r for _, r in pairs], pad_id, side="right")
    device = model_device(model)
    scores = score_sequences(model, ids.to(device), mask.to(device), normalize=False)
    return scores[: len(pairs)], scores[len(pairs) :]


@torch.no_grad()
def evaluate_pairs(model, pairs, pad_id: int, batch_size: int) -> dict[str, float]:
    """Pairwise accuracy (chosen strictly above rejected), mean BT loss and mean margin."""
    if not pairs:
        return {"accuracy": float("nan"), "loss": float("nan"), "margin": float("nan")}
    was_training = model.training
    model.eval()
    correct, loss, margin = 0.0, 0.0, 0.0
    for start in range(0, len(pairs), batch_size):
        rc, rr = _pair_scores(model, pairs[start : start + batch_size], pad_id)
        diff = rc - rr
        correct += float((diff > 0).sum())
        loss += float(-F.logsigmoid(diff).sum())
        margin += float(diff.sum())
    model.train(was_training)
    n = len(pairs)
    return {"accuracy": correct / n, "loss": loss / n, "margin": margin / n}


def _load_rm_rows(tokenizer, rows, cfg: RMConfig, eval_rows, reference_rows, seed: int):
    """The training and held-out pairs and the normalisation reference (None: the pairs' own sides)."""
    rows = load_preference_rows(rows, name="preference data")
    check_chat_template(tokenizer, rows, "preference data")
    ref = None
    if cfg.normalize and reference_rows is not None:
        ref = load_sft_rows(reference_rows, name="reward reference data")
        check_chat_template(tokenizer, ref, "reward reference data")
    if eval_rows is not None:
        held_rows = load_preference_rows(eval_rows, name="preference eval data")
        check_chat_template(tokenizer, held_rows, "preference eval data")
        return rows, held_rows, ref
    train_rows, held_rows = split_rows(rows, cfg.heldout_fraction, seed)
    return train_rows, held_rows, ref


def _fit_pairs(model, train_pairs, pad_id: int, cfg: RMConfig, n_steps: int, seed: int, log_fn):
    """The Bradley–Terry loop: ``-log σ(r(chosen) - r(rejected))`` per batch; per-step losses and accuracies."""
    opt = make_optimizer(model, cfg.lr, cfg.weight_decay)
    sched = make_scheduler(opt, cfg.schedule, cfg.warmup_steps, n_steps)
    model.train()
    losses: list[float] = []
    accs: list[float] = []
    for step, idx in enumerate(batch_indices(len(train_pairs), cfg.batch_size, n_steps, seed), start=1):
        rc, rr = _pair_scores(model, [train_pairs[i] for i in idx], pad_id)
        loss = -F.logsigmoid(rc - rr).mean()
        grad_norm = optimizer_step(model, opt, sched, loss, cfg.max_grad_norm, what="reward-model", step=step)
        losses.append(loss.item())
        accs.append(float((rc > rr).float().mean()))
        entry = window_log_entry(
            "rm", step, n_steps, cfg.log_every, sched, grad_norm, loss=losses, accuracy=accs
        )
        if entry is not None:
            logger.info("rm step %d/%d loss %.4f acc %.3f", step, n_steps, entry["loss"], entry["accuracy"])
            if log_fn is not None:
                log_fn(entry)
    return losses, accs


def _renormalize(model, tokenizer, cfg: RMConfig, train_rows, ref) -> tuple[float | None, float | None]:
    """Drop any stored normalisation (the scores changed) and, with ``cfg.normalize``, fit a new one."""
    for key in (MEAN_KEY, STD_KEY):
        if hasattr(model.config, key):
            delattr(model.config, key)
    if not cfg.normalize:
        return None, None
    if ref is not None:
        prompts, responses = [r["prompt"] for r in ref], [r["response"] for r in ref]
    else:
        prompts = [r["prompt"] for r in train_rows] * 2
        responses = [r["chosen"] for r in train_rows] + [r["rejected"] for r in train_rows]
    with naming("reward reference data" if ref is not None else "preference data"):
        return normalize_reward_model(
            model, tokenizer, prompts, responses, cfg.eval_batch_size, add_special_tokens=cfg.add_special_tokens
        )


def train_reward_model(
    model,
    tokenizer,
    rows: RowsLike,
    cfg: RMConfig | None = None,
    output_dir=None,
    eval_rows: RowsLike | None = None,
    reference_rows: RowsLike | None = None,
    log_fn: Callable[[dict], None] | None = None,
    seed: int = 0,
) -> dict:
    """Train ``model`` in place on pairs (columns ``prompt``, ``chosen``, ``rejected``); returns metrics.

    ``rows`` is anything :func:`~ppo_lm.data.examples.load_preference_rows` accepts: ``prompt`` text or
    chat messages (rendered with the tokenizer's chat template), ``chosen``/``rejected`` text or one
    assistant message each, or, without ``prompt``, two conversations that differ only in their last
    (assistant) turn.

    Loss: ``-log σ(r(chosen) - r(rejected))`` on raw scores, mean over pairs. Held-out pairs are
    ``eval_rows`` if given, else a ``heldout_fraction`` of ``rows`` (``seed`` decides the split, the
    batch order and torch's RNG). With ``cfg.normalize`` the
    reference set is ``reference_rows`` (``prompt`` and ``response``, or ``messages``, as SFT data) if given, else the chosen
    and rejected sides of the training pairs. ``output_dir`` gets ``save_pretrained`` model and
    tokenizer and ``rm_metrics.json``. The model's train/eval mode is restored on return.

    Metrics: ``train_loss``/``train_accuracy`` (per step), ``heldout_accuracy_before``/``after``,
    ``heldout_loss_before``/``after``, ``heldout_margin_after``, ``reward_mean``/``reward_std``
    (None without normalisation), ``steps``, ``n_train``, ``n_heldout``, ``n_skipped_too_long``,
    ``wall_time_s``.
    """
    cfg = cfg or RMConfig()
    check_stage_config(cfg, "rm")
    train_rows, held_rows, ref = _load_rm_rows(tokenizer, rows, cfg, eval_rows, reference_rows, seed)
    if getattr(model.config, "num_labels", 1) != 1:
        raise InputError(f"the reward model needs num_labels=1, got {model.config.num_labels}")
    pad_id = _pad_id(tokenizer)

    with naming("preference data"):
        train_pairs, skipped = _encode_pairs(tokenizer, train_rows, cfg)
    with naming("preference data" if eval_rows is None else "preference eval data"):
        held_pairs, held_skipped = _encode_pairs(tokenizer, held_rows, cfg)
    if not train_pairs:
        raise InputError(f"all {len(train_rows)} pairs are longer than max_length={cfg.max_length}")
    n_steps = total_steps(len(train_pairs), cfg.batch_size, cfg.epochs, cfg.max_steps)

    was_training = model.training
    torch.manual_seed(seed)
    before = evaluate_pairs(model, held_pairs, pad_id, cfg.eval_batch_size)
    t0 = time.perf_counter()
    losses, accs = _fit_pairs(model, train_pairs, pad_id, cfg, n_steps, seed, log_fn)
    wall = time.perf_counter() - t0
    after = evaluate_pairs(model, held_pairs, pad_id, cfg.eval_batch_size)
    reward_mean, reward_std = _renormalize(model, tokenizer, cfg, train_rows, ref)
    model.train(was_training)

    metrics = {
        "train_loss": losses,
        "train_accuracy": accs,
        "heldout_accuracy_before": before["accuracy"],
        "heldout_accuracy_after": after["accuracy"],
        "heldout_loss_before": before["loss"],
        "heldout_loss_after": after["loss"],
        "heldout_margin_after": after["margin"],
        "reward_mean": reward_mean,
        "reward_std": reward_std,
        "steps": n_steps,
        "n_train": len(train_pairs),
        "n_heldout": len(held_pairs),
        "n_skipped_too_long": skipped + held_skipped,
        "wall_time_s": wall,
        "seed": seed,
        "config": asdict(cfg),
    }
    if output_dir is not None:
        save_artifacts(output_dir, model, tokenizer, metrics, "rm_metrics.json")
    return metrics
