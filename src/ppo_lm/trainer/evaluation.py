"""Held-out evaluation of a training run (``data.eval_prompts`` every ``log.eval_every`` iterations):
greedy responses (or ``log.eval_samples`` samples for pass@k) scored by the gold verifier or the
reward's verifiers — or, with a multi-turn environment, held-out episodes scored by their return."""

from __future__ import annotations

import dataclasses

import torch
from torch import Tensor

from ..rollout.episodes import evaluate_episodes
from ..rollout.evaluate import evaluate
from ..rollout.reward import combine_terms, score_with_verifier
from ..runtime import distributed as dist
from ..runtime.timing import Timer
from . import schedule


def held_out_metrics(trainer, iteration: int) -> dict[str, float]:
    """``eval_score`` (and ``eval_pass_at_k`` with k > 1, ``eval_turns`` with an environment) over the
    held-out rows, global over ranks: each rank takes a share of the rows; the sampling generator is a
    fixed function of the seed and the iteration, so evaluating never moves the training's random
    streams, and held-out episodes have seeds of their own, one per row (its k samples share it), the
    same at every evaluation and on any number of ranks (trainer/schedule.py)."""
    t = trainer
    cfg, k = t.cfg, t.cfg.log.eval_samples
    timer = Timer()
    params = dataclasses.replace(t.sampling, temperature=0.0) if k == 1 else t.sampling
    gen = torch.Generator(device=t.device).manual_seed(schedule.held_out_sampling_seed(cfg.seed, iteration, t.rank))
    rows = t.eval_rows[t.rank :: t.world]
    out = {"eval_score": 0.0, "eval_pass_at_k": 0.0}
    if rows and t.multi_turn:  # held-out episodes: their mean return
        seeds = schedule.held_out_seeds(cfg.seed, len(t.eval_rows), rank=t.rank, world=t.world)
        out = evaluate_episodes(t.engine, t.tokenizer, t.envs, rows, seeds, renderer=t.renderer,
                                sampling=params, settings=t.episode_settings, samples=k,
                                pass_score=cfg.log.eval_pass_score, generator=gen, device=t.device)
    elif rows:
        out = evaluate(t.engine, t.tokenizer, rows, lambda p, r, c: verifier_scores(t, p, r, c), params,
                       samples=k, pass_score=cfg.log.eval_pass_score, prompt_column=cfg.data.prompt_column,
                       generator=gen, add_special_tokens=not t.chat_prompts)
    totals = torch.tensor([out["eval_score"] * len(rows), out.get("eval_pass_at_k", 0.0) * len(rows),
                           out.get("eval_turns", 0.0) * len(rows), float(len(rows))], dtype=torch.double)
    s_score, s_pass, s_turns, n = dist.all_reduce_sum(totals).tolist()
    metrics = {"eval_score": s_score / n, "eval_s": timer.since_start()}
    if k > 1:
        metrics["eval_pass_at_k"] = s_pass / n
    if t.multi_turn:
        metrics["eval_turns"] = s_turns / n
    return metrics


def verifier_scores(trainer, prompts: list[str], responses: list[str], columns: dict[str, list]) -> Tensor:
    """The gold verifier's scores if the run has one, else the reward terms' weighted sum."""
    if trainer.gold_verifier is not None:
        return score_with_verifier(trainer.gold_verifier, prompts, responses, columns)
    return combine_terms(trainer.rewards, [score_with_verifier(term.verifier, prompts, responses, columns)
                                           for term in trainer.rewards])
