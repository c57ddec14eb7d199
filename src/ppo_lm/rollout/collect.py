"""Step 1 of the loop (docs/algorithm.md §1.1): sample responses, then score them with every model, no gradients."""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import torch
from torch import Tensor

from ..data.prompts import encode_prompts
from ..models.actor_critic import CriticModel, PolicyModel
from ..models.lora import adapters_off
from ..models.sharding import frozen_mode
from ..runtime.lanes import Lanes
from ..runtime.timing import Timer
from .batch import RolloutBatch, agreed_length_groups
from .engine import GenerationEngine
from .reward import (
    RewardTerm,
    Verifier,
    combine_terms,
    score_with_model,
    score_with_verifier,
    verifier_rewards,
)
from .sampling import Generation, SamplingParams
from .steps import Steps, merge_steps, step_reward_tensor, weighted
from .text import kept_ids


@dataclass
class RolloutModels:
    policy: PolicyModel
    ref: PolicyModel
    critic: CriticModel | None = None  # separate-body critic
    shared_critic: bool = False  # values come from the policy's value head
    rewards: tuple[RewardTerm, ...] = ()  # the score is their weighted sum
    gold_verifier: Verifier | None = None  # scored for monitoring only


def collect_rollout(
    engine: GenerationEngine,
    models: RolloutModels,
    tokenizer,
    prompt_rows: list[dict],
    *,
    prompt_column: str,
    sampling: SamplingParams,
    samples_per_prompt: int,
    generator: torch.Generator | None,
    forward_batch_size: int = 0,
    missing_eos_penalty: float = 0.0,
    device: torch.device | str = "cpu",
    timer: Timer | None = None,
    logp_from_sampler: bool = False,
    lanes: Lanes | None = None,
    add_special_tokens: bool = True,
) -> RolloutBatch:
    """Sample ``samples_per_prompt`` responses per prompt row with ``engine`` and score them with ``models``.

    ``lanes``: how forwards over rows run (on CPU: shares side by side, :mod:`ppo_lm.runtime.lanes`).
    ``logp_from_sampler``: logp_old from the decode logits (no scoring forward of the policy, unless
    the shared critic needs it for values); by default a training-layout forward computes it.

    ``add_special_tokens``: False for prompts a chat template rendered (it writes its own BOS).

    Episodes are laid out group-contiguous: [p0s0, p0s1, …, p1s0, …]. ``timer`` receives the
    seconds spent in ``generate_s`` and ``score_s`` (all scoring forwards and the reward).
    """
    timer = timer if timer is not None else Timer()
    prompts = [row[prompt_column] for row in prompt_rows for _ in range(samples_per_prompt)]
    prompt_ids, prompt_mask = (t.to(device) for t in encode_prompts(tokenizer, prompts, add_special_tokens))

    with timer("generate_s"):
        gen = engine.generate(prompt_ids, prompt_mask, sampling, generator=generator,
                              return_logprobs=logp_from_sampler)
    with timer("score_s"):
        return score_rollout(models, tokenizer, prompt_rows, prompts, prompt_ids, prompt_mask, gen,
                             prompt_column=prompt_column, samples_per_prompt=samples_per_prompt,
                             temperature=sampling.temperature or 1.0, forward_batch_size=forward_batch_size,
                             missing_eos_penalty=missing_eos_penalty, device=device, lanes=lanes)


def score_rollout(models: RolloutModels, tokenizer, prompt_rows: list[dict], prompts: list, prompt_ids: Tensor,
                  prompt_mask: Tensor, gen: Generation, *, prompt_column: str, samples_per_prompt: int,
                  temperature: float, forward_batch_size: int, missing_eos_penalty: float,
                  device: torch.device | str, lanes: Lanes | None) -> RolloutBatch:
    """The sampled responses ``gen`` of (B, P) prompts scored by every model (:func:`score_sequences`),
    then by the verifiers."""
    P = prompt_ids.shape[1]
    input_ids = torch.cat([prompt_ids, gen.responses], 1)
    attention_mask = torch.cat([prompt_mask, gen.mask.to(prompt_mask.dtype)], 1)
    T = gen.responses.shape[1]
    lengths = gen.mask.sum(1)
    # By default logp_old comes from the training forward (not the decode logits), so the first
    # update's ratio is 1 to rounding.
    sampler_logp = gen.logprobs if gen.logprobs is not None and not models.shared_critic else None
    logp_old, logp_ref, values_all, term_scores = score_sequences(
        models, input_ids, attention_mask, P, lengths, temperature=temperature,
        forward_batch_size=forward_batch_size, device=device, lanes=lanes, sampler_logp=sampler_logp)

    kept = kept_ids(gen)
    responses_text = tokenizer.batch_decode(kept, skip_special_tokens=True)
    columns = {k: [row[k] for row in prompt_rows for _ in range(samples_per_prompt)]
               for k in prompt_rows[0] if k != prompt_column}
    scores, gold, steps = verify(models, prompts, responses_text, columns, term_scores, device=device)
    step_rewards = step_counts = None
    if steps is not None:  # process rewards: each on the token that completes its character
        step_rewards, step_counts = step_reward_tensor(tokenizer, kept, responses_text, steps, T, device=device)
    if missing_eos_penalty:
        scores = scores - missing_eos_penalty * (~gen.terminated).float()

    values_old, bootstrap = old_values(values_all, gen.mask)
    return RolloutBatch(
        input_ids=input_ids,
        attention_mask=attention_mask,
        prompt_width=P,
        response_mask=gen.mask,
        terminated=gen.terminated,
        logp_old=logp_old.where(gen.mask, 0),
        logp_ref=logp_ref.where(gen.mask, 0),
        scores=scores.float(),
        values_old=values_old,
        bootstrap_values=bootstrap,
        step_rewards=step_rewards,
        step_counts=step_counts,
        gold_scores=gold,
        score_terms={term.name: s.float() for term, s in zip(models.rewards, term_scores)}
        if len(models.rewards) > 1 else None,
        prompts=prompts,
        responses=responses_text,
    )


def old_values(values_all: Tensor | None, mask: Tensor) -> tuple[Tensor | None, Tensor | None]:
    """(B, T + 1) values of a scoring forward → V_old (B, T) on the valid tokens and the bootstrap value
    V_old(x_{l+1}) (B,) of the context after each row's last token; Nones without a critic."""
    if values_all is None:
        return None, None
    T = mask.shape[1]
    return values_all[:, :T].where(mask, 0), values_all.gather(1, mask.sum(1).unsqueeze(1)).squeeze(1)


def score_sequences(models: RolloutModels, input_ids: Tensor, attention_mask: Tensor, P: int, lengths: Tensor, *,
                    temperature: float, forward_batch_size: int, device: torch.device | str, lanes: Lanes | None,
                    sampler_logp: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor | None, list[Tensor]]:
    """Every model's forward over (B, P + T) prompt ‖ response sequences whose responses have ``lengths``
    (B,) tokens — π_old (unless ``sampler_logp`` gives logp_old), π_ref, V_old, reward models — in
    length groups of rows. Returns ``(logp_old (B, T), logp_ref (B, T), values (B, T + 1) or None,
    reward-model scores (B,) per reward term, zeros for verifiers)``."""
    B = input_ids.shape[0]
    T = input_ids.shape[1] - P
    logp_old = torch.zeros(B, T, device=device) if sampler_logp is None else sampler_logp
    logp_ref = torch.zeros(B, T, device=device)
    values_all = None
    if models.critic is not None or models.shared_critic:
        values_all = torch.zeros(B, T + 1, device=device)
    groups = agreed_length_groups(lengths, forward_batch_size, prompt_width=P)  # (rows, response width) per forward
    last_index = P + lengths - 1
    term_scores = [torch.zeros(B, device=device) for _ in models.rewards]

    def score_rows(rows: Tensor, *, w: int) -> None:
        # Every model on these rows; the outputs are preallocated and rows are disjoint between lanes.
        ids, mask = input_ids[rows, : P + w], attention_mask[rows, : P + w]
        with torch.no_grad():
            if sampler_logp is None:
                out = models.policy(ids, mask, P, temperature=temperature, with_values=models.shared_critic)
                logp_old[rows, :w] = out["logp"]
                if models.shared_critic:
                    values_all[rows, : w + 1] = out["values"]
            if models.critic is not None:
                values_all[rows, : w + 1] = models.critic(ids, mask, P)
        if not ref_apart:
            score_ref(rows, w=w)
        for term, out in zip(models.rewards, term_scores):
            if term.model is not None:
                out[rows] = score_with_model(term.model, ids, mask, last_index[rows])

    def score_ref(rows: Tensor, *, w: int) -> None:
        with frozen_mode(models.ref):
            logp_ref[rows, :w] = models.ref(input_ids[rows, : P + w], attention_mask[rows, : P + w], P,
                                            temperature=temperature)["logp"]

    # A LoRA reference is the policy with its adapters off, a switch of the model shared by every lane:
    # it is scored in a pass of its own, with the switch held off for the whole pass.
    ref_apart = models.ref.base_only
    lanes = lanes or Lanes(1)
    for rows, w in groups:
        lanes.map_rows(partial(score_rows, w=w), rows, lengths[rows], P)
    if ref_apart:
        with adapters_off(models.ref.lm):
            for rows, w in groups:
                lanes.map_rows(partial(score_ref, w=w), rows, lengths[rows], P)
    # leave inference mode: these tensors are used next to autograd ones
    return logp_old, logp_ref.clone(), values_all, term_scores


def verify(models: RolloutModels, prompts: list, responses: list[str], columns: dict[str, list],
           term_scores: list[Tensor], *, device: torch.device | str
           ) -> tuple[Tensor, Tensor | None, list[Steps] | None]:
    """The verifiers' scores of the responses into ``term_scores`` (where the reward models' already
    are, (B,) each), and ``(score, gold score, steps)``: the terms' weighted sum, the gold verifier's
    (None without one), (B,) each, and the terms' weighted step rewards per response (None when no
    verifier returned a :class:`~ppo_lm.rollout.steps.Reward`)."""
    term_steps = []
    for i, term in enumerate(models.rewards):
        if term.verifier is not None:
            scores, steps = verifier_rewards(term.verifier, prompts, responses, columns)
            term_scores[i] = scores.to(device)
            term_steps.append(None if steps is None else weighted(steps, term.weight))
    gold = None
    if models.gold_verifier is not None:
        gold = score_with_verifier(models.gold_verifier, prompts, responses, columns).to(device)
    return combine_terms(models.rewards, term_scores), gold, merge_steps(term_steps, len(prompts))
