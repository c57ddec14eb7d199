"""An OpenEnv environment (PyPI ``openenv``): guess a number from 0 to 9, told higher or lower, with a
reward at every step — a small text game written against OpenEnv's own ``Environment``, ``Action`` and
``Observation``, as OpenEnv's servers host them. ppo-lm trains on it with `--rollout.env
examples/environments/openenv_guess.py:GuessEnv` (in its environment workers) or against a server
running it (docs/environments.md, "OpenEnv environments"): the policy's text fills the action's one
text field, `guess`, and the observation's one text field, `message`, is the next user turn.
"""

from __future__ import annotations

import random

from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State


class GuessAction(Action):
    guess: str


class GuessObservation(Observation):
    message: str = ""


class GuessEnv(Environment[GuessAction, GuessObservation, State]):
    SUPPORTS_CONCURRENT_SESSIONS = True  # each session its own instance: no shared state

    def __init__(self):
        super().__init__()
        self._state = State()
        self.secret = 0

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs) -> GuessObservation:
        self.secret = random.Random(seed).randint(0, 9)
        self._state = State(episode_id=episode_id, step_count=0)
        return GuessObservation(message="Guess my number, 0 to 9. Answer with one digit.\n")

    def step(self, action: GuessAction, timeout_s: float | None = None, **kwargs) -> GuessObservation:
        self._state.step_count += 1
        digits = [c for c in action.guess if c.isdigit()]
        if not digits:
            return GuessObservation(message="One digit, please:\n", reward=-0.1)
        guess = int(digits[0])
        if guess == self.secret:
            return GuessObservation(message="Right.", reward=1.0, done=True)
        # a reward at every step: a wrong guess is paid for by how close it came
        return GuessObservation(message=("Higher:\n" if guess < self.secret else "Lower:\n"),
                                reward=0.1 * (1 - abs(guess - self.secret) / 9))

    @property
    def state(self) -> State:
        return self._state
