"""Step 1's sampling half (docs/algorithm.md §1.1, docs/environments.md): prompts or an environment's
episodes → :class:`~ppo_lm.rollout.trajectory.Trajectory` records, through a generation engine.

One path for both: a single-turn response is a one-turn episode with no environment. Every episode
of a call advances turn by turn in one batch: the unfinished ones are sampled together, then their
environments step (in parallel, over the pool's workers), and each answer is rendered to
observation ids. Token-in-token-out: an episode's sequence is its first prompt's ids, then per turn
the ids the policy sampled (never re-tokenized) and the observation ids. Nothing here scores: the
learner does (:mod:`ppo_lm.rollout.score.scoring`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from ...data.examples import pad_sequences
from ...data.prompts import encode_prompts
from ..envs.env_pool import EnvPool
from ..envs.environment import EnvError, Renderer
from ..trajectory import Trajectory
from .engine import GenerationEngine
from .sampling import SamplingParams

UNLIMITED = 1 << 62  # a single-turn episode's token limit: the response limit alone bounds it


@dataclass(frozen=True)
class EpisodeSettings:
    max_turns: int
    max_episode_tokens: int  # prompt + every turn and observation
    max_live: int = 0  # episodes in play at once (whole groups); 0 = the whole batch


@dataclass
class _Live:
    """An episode in flight: its record and what only the producer needs while it runs."""

    traj: Trajectory
    eid: int = -1  # its environment's id in the pool
    tools: list[dict] | None = None  # the JSON schemas of its environment's tools, for the chat template
    history: list[dict] | None = None  # the conversation so far (chat templates), else None
    finished: bool = False


class Producer:
    """Trajectories from prompt rows (single-turn) or from an environment's episodes (``envs``, with
    the ``renderer`` of its answers and the ``episodes`` limits), sampled by ``engine``.

    ``prompt_column``, ``add_special_tokens``: how a single-turn row's prompt is encoded
    (:func:`~ppo_lm.data.prompts.encode_prompts`; False for prompts a chat template rendered).
    ``agents``: instead, a user's agent plays each episode through the OpenAI client
    (:class:`~ppo_lm.rollout.agents.episodes.AgentEpisodes`, which samples through ``engine``).
    """

    def __init__(self, engine: GenerationEngine, tokenizer, *, device: torch.device | str = "cpu",
                 envs: EnvPool | None = None, renderer: Renderer | None = None,
                 episodes: EpisodeSettings | None = None, prompt_column: str = "prompt",
                 add_special_tokens: bool = True, agents=None):
        if envs is not None and (renderer is None or episodes is None):
            raise ValueError("an environment's producer needs its renderer and its episode settings")
        self.engine, self.tokenizer, self.device = engine, tokenizer, device
        self.envs, self.renderer, self.agents = envs, renderer, agents
        self.episodes = episodes if envs is not None else EpisodeSettings(1, UNLIMITED)
        self.prompt_column, self.add_special_tokens = prompt_column, add_special_tokens

    @property
    def environment(self) -> bool:
        """Whether it plays episodes, an environment's or an agent's (their turn rewards are the reward)."""
        return self.envs is not None or self.agents is not None

    def produce(self, rows: list[dict], *, samples: int, sampling: SamplingParams,
                generator: torch.Generator | None, seeds: list[int] | None = None) -> list[Trajectory]:
        """``samples`` episodes per row, group-contiguous ([r0s0, r0s1, …, r1s0, …]), to the end: a stop
        token (single-turn), or done, the turn limit, or a context with no room left (environments).
        ``seeds``: one per row with an environment, its group's — the G episodes of a row play one task."""
        if self.agents is not None:
            return self.agents.trajectories(self.engine, generator, rows, samples, sampling)
        with self.engine.session():  # FSDP: one all-gather for every turn's decode
            if self.envs is None:
                return self._responses(rows, samples, sampling, generator)
            return self._episodes(rows, seeds, samples, sampling, generator)

    def _responses(self, rows: list[dict], samples: int, sampling: SamplingParams,
                   generator: torch.Generator | None) -> list[Trajectory]:
        expanded = [row for row in rows for _ in range(samples)]
        ids, mask = encode_prompts(self.tokenizer, [row[self.prompt_column] for row in expanded],
                                   self.add_special_tokens)
        live = [_Live(Trajectory(p[m.bool()].tolist(), row=row, version=self.engine.version))
                for p, m, row in zip(ids, mask, expanded)]
        for e, (_, stopped) in zip(live, self._sample_turn(live, sampling, generator)):
            e.traj.terminated = stopped
        return [e.traj for e in live]

    def _episodes(self, rows: list[dict], seeds: list[int] | None, samples: int, sampling: SamplingParams,
                  generator: torch.Generator | None) -> list[Trajectory]:
        if seeds is None or len(seeds) != len(rows):
            raise ValueError("an environment's episodes need one seed per row")
        # an environment that holds few sessions at once (rollout.env_sessions) plays the batch in waves
        # of whole groups, each wave sampled as one batch
        rows_at_once = max(self.episodes.max_live // samples, 1) if self.episodes.max_live else len(rows)
        out = []
        for first in range(0, len(rows), rows_at_once):
            part = slice(first, first + rows_at_once)
            out += self._wave(rows[part], seeds[part], samples, sampling, generator)
        return out

    def _wave(self, rows: list[dict], seeds: list[int], samples: int, sampling: SamplingParams,
              generator: torch.Generator | None) -> list[Trajectory]:
        live = self._start(rows, seeds, samples)
        try:
            for turn in range(self.episodes.max_turns):
                if all(e.finished for e in live):
                    break
                self._take_turn(live, sampling, generator, last_turn=turn == self.episodes.max_turns - 1)
        finally:
            self.envs.drop([e.eid for e in live])
        return [e.traj for e in live]

    def _start(self, rows: list[dict], seeds: list[int], samples: int) -> list[_Live]:
        """``samples`` episodes per row, each environment reset with its row's seed and its index in the group."""
        limit = self.episodes.max_episode_tokens
        live = []
        for i, st in enumerate(self.envs.start(rows, seeds, samples)):
            ids, history = self.renderer.first_prompt(st.first, st.tools)
            if len(ids) >= limit:
                raise EnvError(f"the environment's first prompt for row {i // samples} has {len(ids)} tokens, which "
                               f"leaves no room for a response in `rollout.max_episode_tokens` ({limit})")
            traj = Trajectory(ids, row=rows[i // samples], seed=seeds[i // samples], version=self.engine.version)
            live.append(_Live(traj, st.eid, st.tools, history))
        return live

    def _sample_turn(self, live: list[_Live], sampling: SamplingParams,
                     generator: torch.Generator | None) -> list[tuple[list[int], bool]]:
        """One turn of every episode in ``live``, sampled in one batch and appended to its record (cut to
        the room its episode has left). Returns each turn's ids and whether a stop token ended it."""
        limit_tokens = self.episodes.max_episode_tokens
        ids, mask = (t.to(self.device) for t in pad_sequences(
            [e.traj.prompt_ids + e.traj.tokens for e in live], self.tokenizer.pad_token_id, side="left"))
        limit = min(sampling.max_new_tokens, max(e.traj.room(limit_tokens) for e in live))
        params = replace(sampling, max_new_tokens=limit, min_new_tokens=min(sampling.min_new_tokens, limit))
        gen = self.engine.generate(ids, mask, params, generator=generator, return_logprobs=True)
        lengths = gen.mask.sum(1).tolist()
        turns = []
        for e, row, n, stopped, logp in zip(live, gen.responses.cpu(), lengths, gen.terminated.tolist(),
                                            gen.logprobs.cpu()):
            sampled = row[:n].tolist()[: e.traj.room(limit_tokens)]
            e.traj.add_action(sampled, logp[: len(sampled)].tolist())
            turns.append((sampled, stopped and len(sampled) == n))
        return turns

    def _take_turn(self, live: list[_Live], sampling: SamplingParams, generator: torch.Generator | None, *,
                   last_turn: bool) -> None:
        """One turn of every unfinished episode: sample in one batch, then step their environments."""
        active = [e for e in live if not e.finished]
        decode = self.tokenizer.decode
        turns = []  # per active episode: (text, stop text or None)
        for sampled, stopped in self._sample_turn(active, sampling, generator):
            text = decode(sampled[:-1] if stopped else sampled, skip_special_tokens=True)
            turns.append((text, decode(sampled[-1:]) if stopped else None))
        answers = self.envs.step([(e.eid, text) for e, (text, _) in zip(active, turns)])
        room_limit = self.episodes.max_episode_tokens
        for e, (text, stop_text), (obs, reward, done) in zip(active, turns, answers):
            e.traj.rewards.append(reward)
            if done:
                e.traj.terminated = e.finished = True
                continue
            if e.traj.room(room_limit) <= 0:
                e.finished = e.traj.context_truncated = True
                continue
            if obs is not None:
                obs_ids, e.history = self.renderer.observation(e.history, text, stop_text, obs, e.tools)
                if len(obs_ids) >= e.traj.room(room_limit):  # it must leave room for one more action token
                    e.finished = e.traj.context_truncated = True
                    continue
                e.traj.add_observation(obs_ids)
            e.finished = last_turn
