"""Held-out evaluation of a training run (``data.eval_prompts`` every ``log.eval_every`` iterations):
greedy responses (or ``log.eval_samples`` samples for pass@k) scored by the gold verifier or the
reward's verifiers — or, with a multi-turn environment, held-out episodes scored by their return."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
from torch import Tensor

from ..rollout.evaluate import evaluate, evaluate_episodes
from ..rollout.sample.producer import Producer
from ..rollout.sample.sampling import SamplingParams
from ..rollout.score.reward import RewardTerm, Verifier, combine_terms, score_with_verifier
from ..runtime import distributed as dist
from ..runtime.timing import Timer
from . import seeds


@dataclass(frozen=True)
class HeldOut:
    """What held-out evaluation runs on. producer: the run's (its engine, its environment if any);
    rows: every rank's held-out rows; sampling: the run's settings (greedy when ``samples`` is 1);
    samples: k (``log.eval_samples``); pass_score: ``log.eval_pass_score``; seed: the run's;
    rewards, gold_verifier: what scores a single-turn response (the gold verifier if the run has one)."""

    producer: Producer
    rows: list[dict]
    sampling: SamplingParams
    samples: int
    pass_score: float
    seed: int
    device: torch.device
    rank: int
    world: int
    rewards: tuple[RewardTerm, ...]
    gold_verifier: Verifier | None

    def verifier_scores(self, prompts: list[str], responses: list[str], columns: dict[str, list]) -> Tensor:
        """The gold verifier's scores if the run has one, else the reward terms' weighted sum."""
        if self.gold_verifier is not None:
            return score_with_verifier(self.gold_verifier, prompts, responses, columns)
        return combine_terms(self.rewards, [score_with_verifier(term.verifier, prompts, responses, columns)
                                            for term in self.rewards])


def held_out_metrics(h: HeldOut, iteration: int) -> dict[str, float]:
    """``eval_score`` (and ``eval_pass_at_k`` with k > 1, ``eval_turns`` with an environment) over the
    held-out rows, global over ranks: each rank takes a share of the rows; the sampling generator is a
    fixed function of the seed and the iteration, so evaluating never moves the training's random
    streams, and held-out episodes have seeds of their own, one per row (its k samples share it), the
    same at every evaluation and on any number of ranks (trainer/seeds.py)."""
    k, timer = h.samples, Timer()
    params = dataclasses.replace(h.sampling, temperature=0.0) if k == 1 else h.sampling
    gen = torch.Generator(device=h.device).manual_seed(seeds.held_out_sampling_seed(h.seed, iteration, h.rank))
    rows = h.rows[h.rank :: h.world]
    out = {"eval_score": 0.0, "eval_pass_at_k": 0.0}
    if rows and h.producer.environment:  # held-out episodes: their mean return
        episode_seeds = seeds.held_out_seeds(h.seed, len(h.rows), rank=h.rank, world=h.world)
        out = evaluate_episodes(h.producer, rows, episode_seeds, params, samples=k, pass_score=h.pass_score, generator=gen)
    elif rows:
        out = evaluate(h.producer, rows, h.verifier_scores, params, samples=k, pass_score=h.pass_score,
                       generator=gen)
    totals = torch.tensor([out["eval_score"] * len(rows), out.get("eval_pass_at_k", 0.0) * len(rows),
                           out.get("eval_turns", 0.0) * len(rows), float(len(rows))], dtype=torch.double)
    s_score, s_pass, s_turns, n = dist.all_reduce_sum(totals).tolist()
    metrics = {"eval_score": s_score / n, "eval_s": timer.since_start()}
    if k > 1:
        metrics["eval_pass_at_k"] = s_pass / n
    if h.producer.environment:
        metrics["eval_turns"] = s_turns / n
    return metrics
