"""The token-level credit file, credit.jsonl (docs/report.md): for the episodes samples.jsonl shows, every
per-token quantity of steps 1–4 — log-probs, KL, shaped reward, value, TD residual, advantage as the
estimator returned it and as the update used it, return, and the ratio after the update — one JSON line
per episode, a list per quantity; a multi-turn episode's also flag its action tokens and list its turns.

``ppo-lm report`` (:mod:`ppo_lm.reporting.credit_report`) draws it; the file is plain JSON for any other tool too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from ..algorithms import adaptive_lambda, get_advantage_estimator, kl_penalty
from ..algorithms.advantages import compact_tokens, td_residuals
from ..config.train import AlgoConfig, TrainConfig
from ..rollout.score.batch import RolloutBatch

CREDIT_FILE = "credit.jsonl"

PER_TOKEN_KEYS = ("logp_old", "logp_ref", "kl", "reward", "value", "delta", "advantage_raw", "advantage",
                  "return", "ratio")
"""The per-token lists of a record, in order; ``value``, ``delta`` and ``return`` are null without a critic."""


@dataclass(frozen=True)
class CreditTargets:
    """Steps 2–3's per-token tensors of one rollout, (B, T) each as the rollout's response block.

    rewards: shaped rewards r_t (the ones the advantages were computed from).
    advantages_raw: the estimator's Â, before the trainer whitens it (GAE with `algo.whiten_advantages`).
    advantages: the Â the update trained on.
    returns: critic targets R̂_t, or None without a critic.
    kl_coef: the β that shaped ``rewards`` (0 when the KL is a loss term).
    """

    rewards: Tensor
    advantages_raw: Tensor
    advantages: Tensor
    returns: Tensor | None
    kl_coef: float


def _num(x: float) -> float | None:
    """7 significant digits (float32 holds about as many) keeps the file compact; JSON has no NaN/inf."""
    return float(f"{x:.7g}") if math.isfinite(x) else None


def _row(t: Tensor | None, i: int, n: int, action: list[bool] | None = None) -> list[float | None] | None:
    """Row i's first n values; null at observation tokens (``action`` False), which carry none."""
    if t is None:
        return None
    values = [_num(x) for x in t[i, :n].double().tolist()]
    return values if action is None else [v if a else None for v, a in zip(values, action)]


def episode_turns(batch: RolloutBatch, k: int, tokenizer=None) -> list[list[dict] | None]:
    """The turns of ``batch``'s first ``k`` episodes as the logs record them (docs/report.md), or None
    each for a single-turn batch (no ``turn_index``).

    Per turn, ``start`` and ``end`` in the episode's response tokens (0 = the first token after the
    prompt): the turn's sampled tokens are ``[start, end)`` — the observation, if any, follows from
    ``end`` — and ``reward``, the environment's reward for it (on token end − 1: a step reward, the
    score for the last turn). With ``tokenizer``, also ``text`` (the sampled tokens decoded) and
    ``observation`` (the environment's answer after it decoded; "" when the next turn follows directly).
    """
    if batch.turn_index is None:
        return [None] * k
    out: list[list[dict] | None] = []
    for i in range(k):
        n = int(batch.response_mask[i].sum())
        turn, action = batch.turn_index[i, :n].tolist(), batch.action_mask[i, :n].tolist()
        step = batch.step_rewards[i, :n].tolist() if batch.step_rewards is not None else [0.0] * n
        ids = batch.input_ids[i, batch.prompt_width : batch.prompt_width + n].tolist()
        spans: list[list[int]] = [[] for _ in range(max(turn) + 1)]  # each turn's action token positions
        answers: list[list[int]] = [[] for _ in spans]  # and its observation's ids
        for j, (t, a) in enumerate(zip(turn, action)):
            if a:
                spans[t].append(j)
            else:
                answers[t].append(ids[j])
        turns = []
        for t, pos in enumerate(spans):
            start, end = pos[0], pos[-1] + 1
            reward = float(batch.scores[i]) if t == len(spans) - 1 else step[end - 1]
            rec = {"start": start, "end": end, "reward": _num(reward)}
            if tokenizer is not None:
                rec["text"] = tokenizer.decode(ids[start:end], skip_special_tokens=False)
                rec["observation"] = tokenizer.decode(answers[t], skip_special_tokens=False)
            turns.append(rec)
        out.append(turns)
    return out


def ratio_after_update(policy, batch: RolloutBatch, temperature: float) -> Tensor:
    """π_θ(a_t | x_t)/π_old(a_t | x_t) of ``batch``'s response tokens under the updated ``policy``: one
    forward without gradients, computed as the rollout computes logp_old (same forward, same temperature).
    A forward consumes no random numbers (the policy runs in eval mode), so a resumed run stays bit-exact.

    Returns (B, T) fp32, 0 on padding.
    """
    with torch.no_grad():
        logp = policy(batch.input_ids, batch.attention_mask, batch.prompt_width, temperature=temperature)["logp"]
    return torch.exp(logp.float() - batch.logp_old.float()).where(batch.loss_mask, 0)


def credit_records(batch: RolloutBatch, targets: CreditTargets, ratio: Tensor, tokenizer, algo: AlgoConfig,
                   k: int) -> list[dict]:
    """One record per episode for the first ``k`` rows of ``batch`` (the rows samples.jsonl shows).

    ``targets``: the whole batch's tensors (B, T); ``ratio``: (k, T) from :func:`ratio_after_update` on
    the same rows. δ_t is recomputed with :func:`~ppo_lm.algorithms.advantages.td_residuals` — the terms
    GAE accumulates — so Â_raw_t = Σ_l (γλ)^l δ_{t+l} holds on every record of a GAE run.
    """
    # what the advantage_raw column is differs by estimator (REINFORCE++ whitens inside, GRPO/RLOO centre
    # per group), so each record says it and the report labels the column from it
    spec = get_advantage_estimator(algo.estimator)
    raw_is = spec.advantages_are
    rows = torch.arange(k, device=batch.input_ids.device)
    b = batch.select(rows, trim=False)
    mask = b.loss_mask  # multi-turn: the action tokens; observation tokens get 0 in every column
    lengths = b.response_mask.sum(1)
    rewards = targets.rewards[:k]
    kl = kl_penalty(b.logp_old, b.logp_ref, algo.kl_estimator).where(mask, 0)
    deltas = lam = None
    if b.values_old is not None:  # across turns, over the compacted action tokens (docs/algorithm.md §1.3)
        c = compact_tokens(mask)
        deltas = c.scatter(td_residuals(c.gather(rewards), c.gather(b.values_old), c.mask, gamma=algo.gamma,
                                        terminated=b.terminated, bootstrap_values=b.bootstrap_values))
    if spec.uses_lambda:
        lam = ([algo.gae_lambda] * k if algo.adaptive_lambda_alpha is None
               else adaptive_lambda(mask.sum(1), algo.adaptive_lambda_alpha).tolist())
    per_token = {
        "logp_old": b.logp_old, "logp_ref": b.logp_ref, "kl": kl, "reward": rewards, "value": b.values_old,
        "delta": deltas, "advantage_raw": targets.advantages_raw[:k], "advantage": targets.advantages[:k],
        "return": None if targets.returns is None else targets.returns[:k], "ratio": ratio,
    }
    per_token = {key: None if t is None else t.detach().cpu() for key, t in per_token.items()}
    ids = b.input_ids[:, b.prompt_width:].cpu()
    action = ([None] * k if b.action_mask is None  # multi-turn: which tokens the policy sampled
              else [b.action_mask[i, : int(lengths[i])].tolist() for i in range(k)])
    turns = episode_turns(b, k)  # explicit: adjacent turns (no observation between) are one run of `action`
    records = []
    for i in range(k):
        n = int(lengths[i])
        token_ids = ids[i, :n].tolist()
        terminated = bool(b.terminated[i])
        boot = None
        if not terminated and b.bootstrap_values is not None:  # only a truncated row's last δ uses it
            boot = _num(float(b.bootstrap_values[i]))
        records.append({
            "episode": i,
            "prompt": b.prompts[i] if b.prompts else "",
            "response": b.responses[i] if b.responses else "",
            "score": _num(float(b.scores[i])),
            "terminated": terminated,
            "bootstrap_value": boot,
            "estimator": algo.estimator,
            "gamma": algo.gamma,
            "lam": None if lam is None else _num(float(lam[i])),
            "kl_coef": _num(float(targets.kl_coef)),
            "kl_estimator": algo.kl_estimator,
            "whitened": spec.whitened_by_trainer and algo.whiten_advantages,
            "advantage_raw_is": raw_is,
            "token_ids": token_ids,
            "tokens": [tokenizer.decode([t], skip_special_tokens=False) for t in token_ids],
            **{key: _row(per_token[key], i, n, action[i]) for key in PER_TOKEN_KEYS},
            **({} if action[i] is None else {"action": action[i]}),
            **({} if turns[i] is None else {"turns": turns[i]}),
        })
    return records


def log_samples(logger, iteration: int, batch: RolloutBatch, targets: CreditTargets, policy, tokenizer,
                cfg: TrainConfig) -> None:
    """samples.jsonl and credit.jsonl rows of the first `log.num_samples` episodes of ``batch``.

    Every rank calls it, with ``logger`` None but on the main one: the ratio forward is collective under
    FSDP (each rank runs it on as many rows); only the main rank writes.
    """
    k = min(cfg.log.num_samples, batch.size)
    rows = batch.select(torch.arange(k, device=batch.input_ids.device), trim=False)
    ratio = ratio_after_update(policy, rows, cfg.rollout.temperature or 1.0)
    if logger is None:
        return
    turns = episode_turns(rows, k, tokenizer)
    logger.log_samples(iteration, [
        {"prompt": batch.prompts[i], "response": batch.responses[i], "score": float(batch.scores[i]),
         **({} if turns[i] is None else {"turns": turns[i]})}
        for i in range(k)
    ])
    logger.log_credit(iteration, credit_records(batch, targets, ratio, tokenizer, cfg.algo, k))
