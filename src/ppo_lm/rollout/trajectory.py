"""What the producer hands the learner: trajectories, plain CPU records with no model in them
(docs/architecture.md, "Producer, trajectories, source").

A trajectory is one episode as token ids: the prompt, then per turn the ids the policy sampled
(never re-tokenized) and the observation ids its environment's answer rendered to. A single-turn
response is a one-turn episode with no environment: the learner's verifiers and reward models score
it. What the learner needs to score it, and what an off-policy correction needs later, travels with
it: the sampler's log-probabilities, the version of the weights that sampled it, its seed.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Trajectory:
    """One episode (lists in token order, after the prompt).

    prompt_ids: the first prompt's ids, unpadded.
    tokens: every turn's action ids and the observation ids between turns.
    actions: per token, True where the policy sampled it (False: an observation).
    logprobs: per token, the sampler's log-probability of it under softmax(logits / temperature)
        (temperature 0 counts as 1), before top-k/top-p filtering; 0.0 on observation tokens.
    turn_ends: the index in ``tokens`` of each turn's last action token.
    rewards: each turn's reward from the environment; empty without one (the learner scores it).
    terminated: the episode ended itself — the environment said done, or without an environment a
        stop token ended the response; False when a limit cut it (turns, tokens, the context).
    context_truncated: an observation did not fit ``rollout.max_episode_tokens``.
    observation_tokens: how many of ``tokens`` are observations.
    version: the version of the weights that sampled its first turn (every turn, for a source that
        waits for each update before sampling).
    seed: its group's seed (an environment's reset receives it); None without an environment.
    row: the prompt row it answers (its prompt text and the columns a verifier receives).
    segments: an agent's episode (docs/agents.md): how many segments its calls formed (this one trained);
        None for any other.
    error: an agent's episode that ended in an error (scored 0): the error's line.
    """

    prompt_ids: list[int]
    tokens: list[int] = field(default_factory=list)
    actions: list[bool] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    turn_ends: list[int] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)
    terminated: bool = False
    context_truncated: bool = False
    observation_tokens: int = 0
    version: int = 0
    seed: int | None = None
    row: dict | None = None
    segments: int | None = None
    error: str | None = None

    @property
    def turns(self) -> int:
        return len(self.turn_ends)

    def room(self, limit: int) -> int:
        """Tokens left before the sequence (prompt and all) reaches ``limit``."""
        return limit - len(self.prompt_ids) - len(self.tokens)

    def add_action(self, ids: list[int], logprobs: list[float]) -> None:
        """One turn's sampled ids and the sampler's log-probabilities of them."""
        self.tokens += ids
        self.actions += [True] * len(ids)
        self.logprobs += logprobs
        self.turn_ends.append(len(self.tokens) - 1)

    def add_observation(self, ids: list[int]) -> None:
        """An environment's answer, rendered to ids: context for the next turn, no loss."""
        self.tokens += ids
        self.actions += [False] * len(ids)
        self.logprobs += [0.0] * len(ids)
        self.observation_tokens += len(ids)

    def response_ids(self) -> list[int]:
        """A single-turn response's ids without the stop token that ended it (which may be an ordinary
        token such as "\\n", see ``rollout.stop_tokens``): what its text is decoded from."""
        return self.tokens[:-1] if self.terminated else self.tokens


@dataclass
class TrajectoryBatch:
    """An iteration's trajectories from a source, group-contiguous: [p0s0, p0s1, …, p1s0, …].

    group_size: episodes per prompt row (``rollout.samples_per_prompt``).
    environment: the episodes of an environment, whose turn rewards are the reward (else the learner
        scores each response with the run's reward terms).
    iteration: the iteration they were produced for.
    """

    trajectories: list[Trajectory]
    group_size: int
    environment: bool
    iteration: int = 0

    def __len__(self) -> int:
        return len(self.trajectories)
