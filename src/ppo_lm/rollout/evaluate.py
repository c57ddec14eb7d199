"""Evaluation of a policy on held-out prompts with a verifier: greedy (the held-out accuracy of the
demo and of ``log.eval_every``), or k samples per prompt for pass@k."""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..data.prompts import encode_prompts
from .engine import GenerationEngine
from .reward import Verifier, score_with_verifier
from .sampling import SamplingParams
from .text import response_texts

Scorer = Callable[[list[str], list[str], dict[str, list]], torch.Tensor]
"""``f(prompts, responses, columns) -> (B,) scores``."""


@torch.no_grad()
def _responses_and_scores(engine: GenerationEngine, tokenizer, rows: list[dict], score: Scorer, params: SamplingParams, *,
                          prompt_column: str, batch_size: int, generator: torch.Generator | None = None,
                          add_special_tokens: bool = True) -> tuple[list[str], list[float]]:
    """One response per row under ``params``, and its score."""
    responses: list[str] = []
    scores: list[float] = []
    with engine.session():
        for i in range(0, len(rows), batch_size):
            chunk = rows[i : i + batch_size]
            prompts = [r[prompt_column] for r in chunk]
            ids, mask = encode_prompts(tokenizer, prompts, add_special_tokens)
            gen = engine.generate(ids, mask, params, generator=generator)
            texts = response_texts(tokenizer, gen)
            columns = {k: [r[k] for r in chunk] for k in chunk[0] if k != prompt_column}
            scores += score(prompts, texts, columns).tolist()
            responses += texts
    return responses, scores


def evaluate(
    engine: GenerationEngine,
    tokenizer,
    rows: list[dict],
    score: Scorer,
    params: SamplingParams,
    *,
    samples: int = 1,
    pass_score: float = 1.0,
    prompt_column: str = "prompt",
    batch_size: int = 256,
    generator: torch.Generator | None = None,
    add_special_tokens: bool = True,
) -> dict[str, float]:
    """Mean score of ``samples`` responses per row under ``params`` (temperature 0 = greedy), and with
    ``samples`` k > 1 the share of rows with at least one response scoring ≥ ``pass_score`` (pass@k,
    estimated from exactly k samples). Returns ``{"eval_score", ["eval_pass_at_k"]}``.

    ``generator`` seeds the sampling; pass one of its own so evaluation leaves the training's random
    streams untouched (a resumed run stays bit-exact)."""
    expanded = [r for r in rows for _ in range(samples)]
    _, scores = _responses_and_scores(engine, tokenizer, expanded, score, params, prompt_column=prompt_column,
                                      batch_size=batch_size, generator=generator,
                                      add_special_tokens=add_special_tokens)
    out = {"eval_score": sum(scores) / len(scores) if scores else float("nan")}
    if samples > 1:
        per_row = torch.tensor(scores).view(len(rows), samples)
        out["eval_pass_at_k"] = float((per_row >= pass_score).any(1).float().mean())
    return out


def greedy_eval(
    engine: GenerationEngine,
    tokenizer,
    rows: list[dict],
    verifier: Verifier,
    *,
    max_new_tokens: int,
    prompt_column: str = "prompt",
    batch_size: int = 256,
) -> tuple[float, list[str]]:
    """Mean verifier score of greedy responses to ``rows`` and the responses themselves."""
    params = SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0, stop_token_ids=(tokenizer.eos_token_id,))
    responses, scores = _responses_and_scores(
        engine, tokenizer, rows, lambda p, r, c: score_with_verifier(verifier, p, r, c), params,
        prompt_column=prompt_column, batch_size=batch_size)
    return (sum(scores) / len(scores) if scores else float("nan")), responses
