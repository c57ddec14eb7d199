"""Step 1's scoring half, on the learner's side (docs/algorithm.md §1.1): trajectories → a
:class:`~ppo_lm.rollout.score.batch.RolloutBatch`, every model's forward over the sequences with no
gradients — π_old (or the sampler's log-probabilities, ``rollout.logp_from_sampler``), π_ref, V_old and
the reward models — then the reward: the verifiers' scores of single-turn responses, or an
environment's turn rewards, each on its turn's last action token (the last turn's is the episode's
score, the earlier ones are step rewards, so GAE credits each turn where it ends).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import torch
from torch import Tensor

from ...data.examples import pad_sequences
from ...models.actor_critic import CriticModel, PolicyModel
from ...models.lora import adapters_off
from ...models.sharding import frozen_mode
from ...runtime.lanes import Lanes
from ..trajectory import Trajectory, TrajectoryBatch
from .batch import RolloutBatch, agreed_length_groups
from .reward import (
    RewardTerm,
    Verifier,
    combine_terms,
    score_with_model,
    score_with_verifier,
    verifier_rewards,
)
from .step_rewards import Steps, merge_steps, step_reward_tensor, weighted


@dataclass
class RolloutModels:
    policy: PolicyModel
    ref: PolicyModel
    critic: CriticModel | None = None  # separate-body critic
    values_from_policy: bool = False  # a shared critic: values come from the policy's value head
    rewards: tuple[RewardTerm, ...] = ()  # the score is their weighted sum
    gold_verifier: Verifier | None = None  # scored for monitoring only


@dataclass(frozen=True)
class ScoringSettings:
    """temperature: the sampling temperature the log-probabilities are taken at (0 counts as 1);
    forward_batch_size: rows per scoring forward (0: by length, :func:`agreed_length_groups`);
    missing_eos_penalty: subtracted from the score of a single-turn response the limit cut;
    logp_from_sampler: logp_old is the sampler's (no scoring forward of the policy, unless the shared
        critic needs it for values); by default a training-layout forward computes it, so the first
        update's ratio is 1 to rounding;
    prompt_column: the prompt rows' prompt (what a verifier receives as the prompt)."""

    temperature: float = 1.0
    forward_batch_size: int = 0
    missing_eos_penalty: float = 0.0
    logp_from_sampler: bool = False
    prompt_column: str = "prompt"


@dataclass(frozen=True)
class Packed:
    """Trajectories as tensors: prompts left-padded to P, the rest (turns and observations) right-padded
    to T. input_ids, attention_mask (B, P + T); response_mask, action_mask (B, T) bool;
    logp_behaviour (B, T) fp32 (0 off the actions); versions (B,) int64."""

    input_ids: Tensor
    attention_mask: Tensor
    prompt_width: int
    response_mask: Tensor
    action_mask: Tensor
    logp_behaviour: Tensor
    versions: Tensor


def pack(trajectories: list[Trajectory], pad_token_id: int, device: torch.device | str) -> Packed:
    prompt_ids, prompt_mask = pad_sequences([t.prompt_ids for t in trajectories], pad_token_id, side="left")
    block, response_mask = pad_sequences([t.tokens for t in trajectories], pad_token_id)
    action_mask = pad_sequences([[int(a) for a in t.actions] for t in trajectories], 0)[0].bool()
    behaviour = torch.zeros(block.shape)
    for i, t in enumerate(trajectories):
        behaviour[i, : len(t.logprobs)] = torch.tensor(t.logprobs)
    response_mask = response_mask.bool()
    return Packed(
        input_ids=torch.cat([prompt_ids, block], 1).to(device),
        attention_mask=torch.cat([prompt_mask, response_mask.to(prompt_mask.dtype)], 1).to(device),
        prompt_width=prompt_ids.shape[1], response_mask=response_mask.to(device),
        action_mask=action_mask.to(device), logp_behaviour=behaviour.to(device),
        versions=torch.tensor([t.version for t in trajectories], device=device))


def score_trajectories(models: RolloutModels, tokenizer, batch: TrajectoryBatch, settings: ScoringSettings, *,
                       device: torch.device | str = "cpu", lanes: Lanes | None = None) -> RolloutBatch:
    """``batch`` scored by every model (:func:`score_sequences`; ``lanes``: how forwards over rows run),
    then by the reward: the run's reward terms for single-turn responses, the turn rewards of an
    environment's episodes."""
    trajs = batch.trajectories
    seqs = pack(trajs, tokenizer.pad_token_id, device)
    sampler_logp = seqs.logp_behaviour if settings.logp_from_sampler and not models.values_from_policy else None
    logp_old, logp_ref, values_all, term_scores = score_sequences(
        models, seqs.input_ids, seqs.attention_mask, seqs.prompt_width, seqs.response_mask.sum(1),
        temperature=settings.temperature or 1.0, forward_batch_size=settings.forward_batch_size, device=device,
        lanes=lanes, sampler_logp=sampler_logp)
    values_old, bootstrap = old_values(values_all, seqs.response_mask)
    mask = seqs.action_mask if batch.environment else seqs.response_mask
    common = dict(
        input_ids=seqs.input_ids, attention_mask=seqs.attention_mask, prompt_width=seqs.prompt_width,
        response_mask=seqs.response_mask, logp_old=logp_old.where(mask, 0), logp_ref=logp_ref.where(mask, 0),
        values_old=None if values_old is None else values_old.where(mask, 0), bootstrap_values=bootstrap,
        logp_behaviour=seqs.logp_behaviour, versions=seqs.versions)
    if batch.environment:
        return RolloutBatch(**common, **episode_fields(tokenizer, trajs, seqs, device=device))
    return RolloutBatch(**common, **response_fields(models, tokenizer, trajs, term_scores, seqs.response_mask.shape[1],
                                                    settings, device=device))


def response_fields(models: RolloutModels, tokenizer, trajs: list[Trajectory], term_scores: list[Tensor], width: int,
                    settings: ScoringSettings, *, device: torch.device | str) -> dict:
    """A single-turn rollout's reward: the verifiers' scores of the responses (beside the reward models'
    ``term_scores``), their step rewards, the missing-EOS penalty; and the texts."""
    kept = [t.response_ids() for t in trajs]
    responses = tokenizer.batch_decode(kept, skip_special_tokens=True)
    column = settings.prompt_column
    prompts = [t.row[column] for t in trajs]
    columns = {k: [t.row[k] for t in trajs] for k in trajs[0].row if k != column}
    scores, gold, steps = verify(models, prompts, responses, columns, term_scores, device=device)
    step_rewards = step_counts = None
    if steps is not None:  # process rewards: each on the token that completes its character
        step_rewards, step_counts = step_reward_tensor(tokenizer, kept, responses, steps, width, device=device)
    terminated = torch.tensor([t.terminated for t in trajs], device=device)
    if settings.missing_eos_penalty:
        scores = scores - settings.missing_eos_penalty * (~terminated).float()
    return dict(
        terminated=terminated, scores=scores.float(), step_rewards=step_rewards, step_counts=step_counts,
        gold_scores=gold, prompts=prompts, responses=responses,
        score_terms={term.name: s.float() for term, s in zip(models.rewards, term_scores)}
        if len(models.rewards) > 1 else None)


def episode_fields(tokenizer, trajs: list[Trajectory], seqs: Packed, *, device: torch.device | str) -> dict:
    """An environment's episodes: the action mask, each turn's reward on its last action token (the last
    turn's as the score), each token's turn, the episode statistics; and the texts."""
    step_rewards = torch.zeros(seqs.response_mask.shape)
    turn_index = torch.full(seqs.response_mask.shape, -1, dtype=torch.long)
    for i, t in enumerate(trajs):
        for end, r in zip(t.turn_ends[:-1], t.rewards[:-1]):
            step_rewards[i, end] += r
        # explicit, since turns with no observation between them are one run of action tokens: a token's
        # turn is the number of turns that ended before it, less one at an observation (it answers that turn)
        ended = torch.zeros(len(t.tokens), dtype=torch.long).index_fill_(0, torch.tensor(t.turn_ends), 1)
        turn_index[i, : len(t.tokens)] = ended.cumsum(0) - ended - (~torch.tensor(t.actions)).long()
    info = {"turns": torch.tensor([t.turns for t in trajs]),
            "observation_tokens": torch.tensor([t.observation_tokens for t in trajs]),
            "context_truncated": torch.tensor([t.context_truncated for t in trajs])}
    if trajs[0].segments is not None:  # an agent's episodes: rewritten histories and errors
        info |= {"segments": torch.tensor([t.segments for t in trajs]),
                 "errors": torch.tensor([t.error is not None for t in trajs])}
    return dict(
        terminated=torch.tensor([t.terminated for t in trajs], device=device),
        scores=torch.tensor([t.rewards[-1] for t in trajs], device=device),
        action_mask=seqs.action_mask, episode_info={k: v.to(device) for k, v in info.items()},
        turn_index=turn_index.to(device), step_rewards=step_rewards.to(device),
        step_counts=torch.tensor([t.turns - 1 for t in trajs], device=device),
        prompts=tokenizer.batch_decode([t.prompt_ids for t in trajs], skip_special_tokens=True),
        responses=tokenizer.batch_decode([t.tokens for t in trajs], skip_special_tokens=False))


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
    if models.critic is not None or models.values_from_policy:
        values_all = torch.zeros(B, T + 1, device=device)
    groups = agreed_length_groups(lengths, forward_batch_size, prompt_width=P)  # (rows, response width) per forward
    last_index = P + lengths - 1
    term_scores = [torch.zeros(B, device=device) for _ in models.rewards]

    def score_rows(rows: Tensor, *, w: int) -> None:
        # Every model on these rows; the outputs are preallocated and rows are disjoint between lanes.
        ids, mask = input_ids[rows, : P + w], attention_mask[rows, : P + w]
        with torch.no_grad():
            if sampler_logp is None:
                out = models.policy(ids, mask, P, temperature=temperature, with_values=models.values_from_policy)
                logp_old[rows, :w] = out["logp"]
                if models.values_from_policy:
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
    verifier returned a :class:`~ppo_lm.rollout.score.step_rewards.Reward`)."""
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
