"""Evaluation of a policy on held-out rows: greedy (the held-out accuracy of the demo and of
``log.eval_every``) or k samples per row for pass@k, scored by a verifier — or, with an environment,
held-out episodes scored by their return. Both sample through a :class:`~ppo_lm.rollout.sample.producer.Producer`."""

from __future__ import annotations

from collections.abc import Callable

import torch

from .sample.producer import Producer
from .sample.sampling import SamplingParams
from .score.reward import Verifier, response_texts, score_with_verifier

Scorer = Callable[[list[str], list[str], dict[str, list]], torch.Tensor]
"""``f(prompts, responses, columns) -> (B,) scores``."""


@torch.no_grad()
def _responses_and_scores(producer: Producer, rows: list[dict], score: Scorer, params: SamplingParams, *,
                          batch_size: int, generator: torch.Generator | None = None) -> tuple[list[str], list[float]]:
    """One response per row under ``params``, and its score."""
    responses: list[str] = []
    scores: list[float] = []
    column = producer.prompt_column
    with producer.engine.session():
        for i in range(0, len(rows), batch_size):
            chunk = rows[i : i + batch_size]
            texts = response_texts(producer.tokenizer, producer.produce(chunk, samples=1, sampling=params,
                                                                        generator=generator))
            columns = {k: [r[k] for r in chunk] for k in chunk[0] if k != column}
            scores += score([r[column] for r in chunk], texts, columns).tolist()
            responses += texts
    return responses, scores


def evaluate(producer: Producer, rows: list[dict], score: Scorer, params: SamplingParams, *, samples: int = 1,
             pass_score: float = 1.0, batch_size: int = 256, generator: torch.Generator | None = None
             ) -> dict[str, float]:
    """Mean score of ``samples`` responses per row under ``params`` (temperature 0 = greedy), and with
    ``samples`` k > 1 the share of rows with at least one response scoring ≥ ``pass_score`` (pass@k,
    estimated from exactly k samples). Returns ``{"eval_score", ["eval_pass_at_k"]}``.

    ``generator`` seeds the sampling; pass one of its own so evaluation leaves the training's random
    streams untouched (a resumed run stays bit-exact)."""
    expanded = [r for r in rows for _ in range(samples)]
    _, scores = _responses_and_scores(producer, expanded, score, params, batch_size=batch_size, generator=generator)
    out = {"eval_score": sum(scores) / len(scores) if scores else float("nan")}
    if samples > 1:
        per_row = torch.tensor(scores).view(len(rows), samples)
        out["eval_pass_at_k"] = float((per_row >= pass_score).any(1).float().mean())
    return out


@torch.no_grad()
def evaluate_episodes(producer: Producer, rows: list[dict], seeds: list[int], params: SamplingParams, *,
                      samples: int = 1, pass_score: float = 1.0, generator: torch.Generator | None = None
                      ) -> dict[str, float]:
    """Held-out episodes of the producer's environment (``samples`` per row, ``seeds`` one per row,
    ``params`` temperature 0 = greedy): the mean episode return Σ turn rewards as ``eval_score``, with
    ``samples`` k > 1 the share of rows with an episode whose return is ≥ ``pass_score`` as
    ``eval_pass_at_k``, and ``eval_turns`` (turns per episode)."""
    episodes = producer.produce(rows, samples=samples, sampling=params, generator=generator, seeds=seeds)
    returns = torch.tensor([sum(e.rewards) for e in episodes], dtype=torch.double)
    out = {"eval_score": float(returns.mean()), "eval_turns": sum(e.turns for e in episodes) / len(episodes)}
    if samples > 1:
        out["eval_pass_at_k"] = float((returns.view(len(rows), samples) >= pass_score).any(1).double().mean())
    return out


def greedy_eval(producer: Producer, rows: list[dict], verifier: Verifier, *, max_new_tokens: int,
                batch_size: int = 256) -> tuple[float, list[str]]:
    """Mean verifier score of greedy responses to ``rows`` and the responses themselves."""
    eos = producer.tokenizer.eos_token_id
    params = SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0, stop_token_ids=(eos,))
    responses, scores = _responses_and_scores(
        producer, rows, lambda p, r, c: score_with_verifier(verifier, p, r, c), params, batch_size=batch_size)
    return (sum(scores) / len(scores) if scores else float("nan")), responses
