"""Step 5's diagnostics of a rollout (docs/algorithm.md §4), as one function of its tensors, and the
warning they can raise."""

from __future__ import annotations

import warnings

import torch
from torch import Tensor

from ..algorithms import episode_returns, explained_variance, kl_penalty, masked_mean_var
from ..rollout.score.batch import RolloutBatch
from ..runtime import distributed as dist


def rollout_metrics(batch: RolloutBatch, rewards: Tensor, advantages: Tensor, returns: Tensor | None, *,
                    beta: float, kl_estimator: str, samples_per_prompt: int) -> dict[str, float]:
    """The rollout's diagnostics of docs/algorithm.md §4, global over ranks: scores (mean, spread, groups
    without signal — equal :func:`~ppo_lm.algorithms.episode_returns`, not just equal last scores — each reward term), KL,
    lengths, truncation, advantages, and the critic's fit.
    ``rewards`` (B, T) shaped; ``advantages``, ``returns`` (B, T) from steps 2–3."""
    mask = batch.loss_mask  # the sampled tokens (a multi-turn episode's observations apart)
    mf = mask.float()
    lengths = mf.sum(1)
    kl = kl_penalty(batch.logp_old, batch.logp_ref, kl_estimator).where(mask, 0).sum(1)
    scores = batch.scores.double().cpu()
    k = samples_per_prompt
    groups = episode_returns(batch.scores, batch.step_rewards, batch.loss_mask).double().cpu().view(-1, k)
    equal_groups = (groups == groups[:, :1]).all(1).double().sum() if k > 1 else torch.zeros((), dtype=torch.double)
    sums = torch.stack([
        torch.tensor(float(batch.size)), batch.scores.sum().cpu(), rewards.sum().cpu(), kl.sum().cpu(),
        lengths.sum().cpu(), (~batch.terminated).float().sum().cpu(), mf.sum().cpu(),
        advantages.where(mask, 0).sum().cpu(), equal_groups,
    ]).double()
    n, s_score, s_rew, s_kl, s_len, s_trunc, n_tok, s_adv, n_equal = dist.all_reduce_sum(sums).tolist()
    # Population stds in two passes (mean, then squared deviations): E[x²] − mean² cancels to noise
    # when |mean| ≫ std, e.g. scores near a large constant.
    _, score_var = masked_mean_var(scores.view(-1, 1), torch.ones(batch.size, 1, dtype=torch.bool),
                                   unbiased=False, all_reduce=dist.all_reduce_sum)
    _, adv_var = masked_mean_var(advantages.double(), mask, unbiased=False, all_reduce=dist.all_reduce_sum)
    score_max, neg_score_min = dist.all_reduce_max(torch.stack([scores.max(), -scores.min()])).tolist()
    adv_mean, score_mean = s_adv / n_tok, s_score / n
    m = {
        "score": score_mean,
        "score_std": float(score_var) ** 0.5,
        "score_min": -neg_score_min,
        "score_max": score_max,
        "shaped_reward": s_rew / n,
        "ref_kl": s_kl / n,
        "kl_coef": beta,
        "response_length_mean": s_len / n,
        "response_length_max": float(dist.all_reduce_max(lengths.max().cpu())),
        "truncated_frac": s_trunc / n,
        "advantage_mean": adv_mean,
        "advantage_std": float(adv_var) ** 0.5,
    }
    if k > 1:
        m["equal_score_groups_frac"] = n_equal / (n / k)
    for name, s in (batch.score_terms or {}).items():
        m[f"score/{name}"] = float(dist.all_reduce_sum(s.sum().double().cpu())) / n
    if batch.step_counts is not None:  # process rewards: their mean per step, and steps per response
        s_steps, n_steps = dist.all_reduce_sum(torch.stack([batch.step_rewards.where(mask, 0).sum().cpu(),
                                                            batch.step_counts.sum().cpu()]).double()).tolist()
        m["step_reward_mean"] = s_steps / max(n_steps, 1.0)
        m["steps_per_response"] = n_steps / n
    if batch.episode_info is not None:  # multi-turn episodes
        info = batch.episode_info
        turn_rewards = episode_returns(batch.scores, batch.step_rewards, batch.loss_mask).sum()  # every turn's reward
        sums = torch.stack([info["turns"].sum().cpu(), info["observation_tokens"].sum().cpu(),
                            info["context_truncated"].sum().cpu(), batch.terminated.sum().cpu(),
                            turn_rewards.cpu()]).double()
        s_turns, s_obs, s_ctx, s_done, s_turn_rewards = dist.all_reduce_sum(sums).tolist()
        m["turns_mean"] = s_turns / n
        m["observation_tokens_mean"] = s_obs / n
        m["done_frac"] = s_done / n
        m["truncated_by_context_frac"] = s_ctx / n
        m["reward_per_turn"] = s_turn_rewards / s_turns
        if "segments" in info:  # an agent's episodes (docs/agents.md): rewritten histories, errors
            s_seg, s_err = dist.all_reduce_sum(torch.stack([info["segments"].sum().cpu(),
                                                            info["errors"].sum().cpu()]).double()).tolist()
            m["segments_per_episode"] = s_seg / n
            m["episode_errors_frac"] = s_err / n
    if batch.gold_scores is not None:
        m["gold_score"] = float(dist.all_reduce_sum(batch.gold_scores.sum().double().cpu())) / n
    if batch.values_old is not None and returns is not None:
        ev = explained_variance(batch.values_old, returns, mask, all_reduce=dist.all_reduce_sum)
        m["explained_variance"] = float(ev)
        s_v, s_ret = dist.all_reduce_sum(torch.stack([batch.values_old.where(mask, 0).sum(),
                                                      returns.where(mask, 0).sum()]).double().cpu()).tolist()
        m["value_mean"] = s_v / n_tok
        m["return_mean"] = s_ret / n_tok
    return m


def warn_if_no_signal(metrics: dict[str, float], *, warned: bool) -> bool:
    """Warn once per run (``warned``: already) where every response of an iteration scored the same
    (``metrics`` from :func:`rollout_metrics`), so the advantages carry no information about which
    response was better — typical of an untrained policy on a hard task. Returns whether the run has
    been warned."""
    if warned or metrics["score_min"] != metrics["score_max"] or metrics.get("steps_per_response"):
        return warned
    if dist.is_main():
        warnings.warn(
            f"every response of this iteration scored {metrics['score_max']:g}: the scores carry no learning "
            "signal. Start from a policy that sometimes succeeds (e.g. after `ppo-lm sft`), sample more per "
            "prompt (`rollout.samples_per_prompt`), or use a reward with partial credit", stacklevel=3)
    return True
