"""An OpenEnv environment (PyPI ``openenv``): an echo game with a reward at every step — a small text
game written against OpenEnv's own ``Environment``, ``Action`` and ``Observation``.

The game says a word, the model says it back; three words a game, each said back earning 1 (the word
anywhere in the reply: the model learns to say it plainly). ppo-lm trains on it in-process
(`--rollout.env examples/environments/openenv_echo.py:EchoEnv`) or against this file serving it with
OpenEnv's own server (docs/environments.md, "Over its server")::

    python examples/environments/openenv_echo.py --port 8000 --sessions 32 &
    ppo-lm train --rollout.env openenv+ws://127.0.0.1:8000 --rollout.env-sessions 32 ...

The policy's text fills the action's one text field, ``say``, and the observation's one text field,
``message``, is the next user turn.
"""

from __future__ import annotations

import argparse
import random

from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State

WORDS = ("apple river stone cloud tiger window garden silver candle forest rocket pepper violin marble dragon "
         "pencil orange bridge castle planet").split()
ROUNDS = 3
ASK = "Repeat this word exactly, with nothing else: {}"


class EchoAction(Action):
    say: str


class EchoObservation(Observation):
    message: str = ""


class EchoEnv(Environment[EchoAction, EchoObservation, State]):
    SUPPORTS_CONCURRENT_SESSIONS = True  # each session its own instance: no shared state

    def __init__(self):
        super().__init__()
        self._state = State()
        self.words: list[str] = []

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs) -> EchoObservation:
        self.words = random.Random(seed).sample(WORDS, ROUNDS)
        self._state = State(episode_id=episode_id, step_count=0)
        return EchoObservation(message=ASK.format(self.words[0]))

    def step(self, action: EchoAction, timeout_s: float | None = None, **kwargs) -> EchoObservation:
        word = self.words[self._state.step_count]
        self._state.step_count += 1
        reward = float(word in action.say.lower())
        if self._state.step_count == ROUNDS:
            return EchoObservation(message="Game over.", reward=reward, done=True)
        told = "Right." if reward else f"No, the word was {word}."
        return EchoObservation(message=f"{told} {ASK.format(self.words[self._state.step_count])}", reward=reward)

    @property
    def state(self) -> State:
        return self._state


def main() -> None:
    """Serve the game with OpenEnv's own server on 127.0.0.1."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--sessions", type=int, default=32, help="the server's max_concurrent_envs")
    args = parser.parse_args()
    import uvicorn
    from openenv.core.env_server import create_fastapi_app

    app = create_fastapi_app(EchoEnv, EchoAction, EchoObservation, max_concurrent_envs=args.sessions)
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
