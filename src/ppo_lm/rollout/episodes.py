"""Step 1 for multi-turn environments (docs/environments.md): every episode of an iteration advances
turn by turn in one batch, then the whole episodes are scored like single-turn responses.

Token-in-token-out: an episode's sequence is its first prompt's ids, then per turn the ids the policy
sampled (never re-tokenized) and the observation ids the environment's answer renders to. Sampled
ids are action tokens; observation ids are context only (no loss, KL, entropy or value target). A
turn's reward lands on its last action token: the last turn's is the episode's score, the earlier
ones are step rewards (docs/algorithm.md §2.1), so GAE credits each turn where it ends.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch

from ..data.examples import pad_sequences
from ..runtime.timing import Timer
from .batch import RolloutBatch
from .collect import RolloutModels, old_values, score_sequences
from .engine import GenerationEngine
from .env_pool import EnvPool
from .environment import EnvError, Renderer
from .sampling import SamplingParams


@dataclass(frozen=True)
class EpisodeSettings:
    max_turns: int
    max_episode_tokens: int  # prompt + every turn and observation


@dataclass
class Episode:
    eid: int  # its environment's id in the pool
    tools: list[dict] | None  # the JSON schemas of its environment's tools, for the chat template
    prompt_ids: list[int]
    history: list[dict] | None  # the conversation so far (chat templates), else None
    tokens: list[int] = field(default_factory=list)  # after the prompt: actions and observations
    actions: list[bool] = field(default_factory=list)
    turn_ends: list[int] = field(default_factory=list)  # index in tokens of each turn's last action token
    rewards: list[float] = field(default_factory=list)
    observation_tokens: int = 0
    done: bool = False
    finished: bool = False
    context_truncated: bool = False

    def room(self, limit: int) -> int:
        return limit - len(self.prompt_ids) - len(self.tokens)


def start_episodes(envs: EnvPool, rows: list[dict], seeds: list[int], renderer: Renderer, samples: int,
                   limit: int) -> list[Episode]:
    """``samples`` episodes per row (group-contiguous), each environment reset with its row's seed —
    the group's: its episodes play one task — and its index in the group."""
    episodes = []
    for i, st in enumerate(envs.start(rows, seeds, samples)):
        ids, history = renderer.first_prompt(st.first, st.tools)
        if len(ids) >= limit:
            raise EnvError(f"the environment's first prompt for row {i // samples} has {len(ids)} tokens, which leaves "
                           f"no room for a response in `rollout.max_episode_tokens` ({limit})")
        episodes.append(Episode(st.eid, st.tools, ids, history))
    return episodes


def take_turn(engine: GenerationEngine, tokenizer, envs: EnvPool, episodes: list[Episode], renderer: Renderer, sampling: SamplingParams,
              s: EpisodeSettings, generator, *, last_turn: bool, device) -> None:
    """One turn of every unfinished episode: sample in one batch, then step their environments (in
    parallel, over the pool's workers)."""
    active = [e for e in episodes if not e.finished]
    ids, mask = (t.to(device) for t in pad_sequences([e.prompt_ids + e.tokens for e in active],
                                                     tokenizer.pad_token_id, side="left"))
    limit = min(sampling.max_new_tokens, max(e.room(s.max_episode_tokens) for e in active))
    params = replace(sampling, max_new_tokens=limit, min_new_tokens=min(sampling.min_new_tokens, limit))
    gen = engine.generate(ids, mask, params, generator=generator)
    turns = []  # per active episode: (text, stop text or None)
    for e, row, row_mask, stopped in zip(active, gen.responses, gen.mask, gen.terminated):
        sampled = row[row_mask].tolist()[: e.room(s.max_episode_tokens)]
        stopped = bool(stopped) and len(sampled) == int(row_mask.sum())
        text = tokenizer.decode(sampled[:-1] if stopped else sampled, skip_special_tokens=True)
        turns.append((text, tokenizer.decode(sampled[-1:]) if stopped else None))
        e.tokens += sampled
        e.actions += [True] * len(sampled)
        e.turn_ends.append(len(e.tokens) - 1)
    for e, (text, stop_text), (obs, reward, done) in zip(
            active, turns, envs.step([(e.eid, text) for e, (text, _) in zip(active, turns)])):
        e.rewards.append(reward)
        if done:
            e.done = e.finished = True
            continue
        if e.room(s.max_episode_tokens) <= 0:
            e.finished = e.context_truncated = True
            continue
        if obs is not None:
            obs_ids, e.history = renderer.observation(e.history, text, stop_text, obs, e.tools)
            if len(obs_ids) >= e.room(s.max_episode_tokens):  # it must leave room for one more action token
                e.finished = e.context_truncated = True
                continue
            e.tokens += obs_ids
            e.actions += [False] * len(obs_ids)
            e.observation_tokens += len(obs_ids)
        e.finished = last_turn


def run_episodes(engine: GenerationEngine, tokenizer, envs: EnvPool, rows: list[dict], seeds: list[int], *, renderer: Renderer,
                 sampling: SamplingParams, settings: EpisodeSettings, samples: int, generator, device) -> list[Episode]:
    """``samples`` episodes per row (``seeds``: one per row, its group's), turn by turn in one batch, to
    the end: done, the turn limit, or a context with no room left."""
    episodes = start_episodes(envs, rows, seeds, renderer, samples, settings.max_episode_tokens)
    try:
        with engine.session():  # FSDP: one all-gather for every turn's decode
            for turn in range(settings.max_turns):
                if all(e.finished for e in episodes):
                    break
                take_turn(engine, tokenizer, envs, episodes, renderer, sampling, settings, generator,
                          last_turn=turn == settings.max_turns - 1, device=device)
    finally:
        envs.drop([e.eid for e in episodes])
    return episodes


def collect_episodes(engine: GenerationEngine, models: RolloutModels, tokenizer, envs: EnvPool, rows: list[dict], seeds: list[int], *,
                     renderer: Renderer, sampling: SamplingParams, settings: EpisodeSettings, samples_per_prompt: int,
                     generator: torch.Generator | None, forward_batch_size: int = 0, device="cpu",
                     timer: Timer | None = None, lanes=None) -> RolloutBatch:
    """Run ``samples_per_prompt`` episodes per row (``seeds``: one per row) to the end — done, the
    turn limit, or a context that has no room left — and score them (:func:`score_sequences`).
    ``timer`` receives ``generate_s`` (sampling and the environments) and ``score_s``; ``lanes`` as for
    :func:`~ppo_lm.rollout.collect.collect_rollout`."""
    timer = timer if timer is not None else Timer()
    with timer("generate_s"):
        episodes = run_episodes(engine, tokenizer, envs, rows, seeds, renderer=renderer, sampling=sampling,
                                settings=settings, samples=samples_per_prompt, generator=generator, device=device)
    with timer("score_s"):
        return score_episodes(models, tokenizer, episodes, temperature=sampling.temperature or 1.0,
                              forward_batch_size=forward_batch_size, device=device, lanes=lanes)


@torch.no_grad()
def evaluate_episodes(engine: GenerationEngine, tokenizer, envs: EnvPool, rows: list[dict], seeds: list[int], *,
                      renderer: Renderer, sampling: SamplingParams, settings: EpisodeSettings, samples: int = 1, pass_score: float = 1.0,
                      generator: torch.Generator | None = None, device="cpu") -> dict[str, float]:
    """Held-out episodes (``samples`` per row, ``sampling`` temperature 0 = greedy): the mean episode
    return Σ turn rewards as ``eval_score``, with ``samples`` k > 1 the share of rows with an episode
    whose return is ≥ ``pass_score`` as ``eval_pass_at_k``, and ``eval_turns`` (turns per episode)."""
    episodes = run_episodes(engine, tokenizer, envs, rows, seeds, renderer=renderer, sampling=sampling,
                            settings=settings, samples=samples, generator=generator, device=device)
    returns = torch.tensor([sum(e.rewards) for e in episodes], dtype=torch.double)
    out = {"eval_score": float(returns.mean()),
           "eval_turns": sum(len(e.rewards) for e in episodes) / len(episodes)}
    if samples > 1:
        out["eval_pass_at_k"] = float((returns.view(len(rows), samples) >= pass_score).any(1).double().mean())
    return out


def score_episodes(models: RolloutModels, tokenizer, episodes: list[Episode], *, temperature: float,
                   forward_batch_size: int, device, lanes) -> RolloutBatch:
    """The finished episodes as one :class:`RolloutBatch`: prompts left-padded to P, the rest (turns and
    observations) right-padded to T, with the action mask, turn rewards and episode statistics."""
    pad = tokenizer.pad_token_id
    prompt_ids, prompt_mask = (t.to(device) for t in pad_sequences([e.prompt_ids for e in episodes], pad, side="left"))
    block, response_mask = pad_sequences([e.tokens for e in episodes], pad)
    action_mask = pad_sequences([[int(a) for a in e.actions] for e in episodes], 0)[0].bool()
    step_rewards = torch.zeros(block.shape)
    turn_index = torch.full(block.shape, -1, dtype=torch.long)
    for i, e in enumerate(episodes):
        for end, r in zip(e.turn_ends[:-1], e.rewards[:-1]):
            step_rewards[i, end] += r
        # explicit, since turns with no observation between them are one run of action tokens: a token's
        # turn is the number of turns that ended before it, less one at an observation (it answers that turn)
        ended = torch.zeros(len(e.tokens), dtype=torch.long).index_fill_(0, torch.tensor(e.turn_ends), 1)
        turn_index[i, : len(e.tokens)] = ended.cumsum(0) - ended - (~torch.tensor(e.actions)).long()
    block, response_mask, action_mask, step_rewards, turn_index = (
        t.to(device) for t in (block, response_mask.bool(), action_mask, step_rewards, turn_index))
    input_ids = torch.cat([prompt_ids, block], 1)
    attention_mask = torch.cat([prompt_mask, response_mask.to(prompt_mask.dtype)], 1)
    P = prompt_ids.shape[1]
    logp_old, logp_ref, values_all, _ = score_sequences(
        models, input_ids, attention_mask, P, response_mask.sum(1), temperature=temperature,
        forward_batch_size=forward_batch_size, device=device, lanes=lanes)
    values_old, bootstrap = old_values(values_all, response_mask)
    if values_old is not None:
        values_old = values_old.where(action_mask, 0)
    info = {"turns": torch.tensor([len(e.rewards) for e in episodes]),
            "observation_tokens": torch.tensor([e.observation_tokens for e in episodes]),
            "context_truncated": torch.tensor([e.context_truncated for e in episodes])}
    return RolloutBatch(
        input_ids=input_ids, attention_mask=attention_mask, prompt_width=P, response_mask=response_mask,
        terminated=torch.tensor([e.done for e in episodes], device=device),
        logp_old=logp_old.where(action_mask, 0), logp_ref=logp_ref.where(action_mask, 0),
        scores=torch.tensor([e.rewards[-1] for e in episodes], device=device),
        values_old=values_old, bootstrap_values=bootstrap, action_mask=action_mask,
        episode_info={k: v.to(device) for k, v in info.items()}, turn_index=turn_index,
        step_rewards=step_rewards, step_counts=torch.tensor([len(e.rewards) - 1 for e in episodes], device=device),
        prompts=tokenizer.batch_decode([e.prompt_ids for e in episodes], skip_special_tokens=True),
        responses=tokenizer.batch_decode([e.tokens for e in episodes], skip_special_tokens=False),
    )
