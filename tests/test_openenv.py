"""OpenEnv environments (PyPI ``openenv``) in ppo-lm's environment workers: the policy's text → the
Action (its text field found or named, or a function), the Observation → the next user turn, done and
reward from the observation (None is 0), a text the Action refuses told to the model, the group's seed
and the row's columns to reset; the same episodes as the environment played by hand."""

from __future__ import annotations

import random
import textwrap
from pathlib import Path

import pytest
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State
from trainer_helpers import tiny_config

from ppo_lm.rollout.envs.env_pool import EnvPool
from ppo_lm.rollout.envs.environment import EnvError, EnvSpec, load_env
from ppo_lm.rollout.envs.openenv import adapt, is_openenv
from ppo_lm.runtime.errors import ConfigError
from ppo_lm.trainer.ppo import PPOTrainer

ROOT = Path(__file__).resolve().parents[1]
GUESS = f"{ROOT / 'examples' / 'environments' / 'openenv_guess.py'}:GuessEnv"


class Move(Action):
    text: str
    note: str | None = None


class Board(Observation):
    board: str = ""
    hint: str = ""


class Game(Environment[Move, Board, State]):
    """Two text fields of each: the mapping must be named. The row's `level` reaches reset by name."""

    def __init__(self):
        super().__init__()
        self.seen: list = []

    def reset(self, seed=None, episode_id=None, level: int = 0, **kwargs) -> Board:
        self.seen.append(("reset", seed, level))
        self.target = random.Random(seed).choice("abc")
        return Board(board=f"level {level}", hint="pick a, b or c")

    def step(self, action: Move, timeout_s=None, **kwargs) -> Board:
        self.seen.append(("step", action.text))
        if action.text.strip() == self.target:
            return Board(board="won", reward=True, done=True)
        return Board(board="again", hint="no")  # reward None: 0

    @property
    def state(self) -> State:
        return State()


class Strict(Action):
    digit: int


class Unannotated(Environment):
    """No generic parameters, no annotations: the Action comes from a function, the observation's field
    from the first observation."""

    def reset(self, seed=None, episode_id=None, **kwargs):
        return Board(board="start")

    def step(self, action, timeout_s=None, **kwargs):
        return Board(board=f"got {action.digit}", reward=0.5, done=action.digit == 3)

    @property
    def state(self):
        return State()


def to_strict(text: str) -> Strict:
    return Strict(digit=text.strip())  # pydantic refuses a non-number: the model is told


def test_an_openenv_environment_is_told_apart_and_wrapped():
    assert is_openenv(Game) and not is_openenv(object)
    cls = load_env(EnvSpec(GUESS))
    assert cls.__name__ == "OpenEnv(GuessEnv)"
    with pytest.raises(ValueError, match=r"`rollout.env_action`='guess' maps an OpenEnv environment's text; Guess "):
        load_env(EnvSpec(f"{ROOT / 'examples' / 'environments' / 'guess.py'}:Guess", action="guess"))


def test_the_text_fields_are_found_or_named_and_the_mapping_runs_both_ways():
    with pytest.raises(ValueError, match=r"`rollout.env_action`: Move is the environment's Action, and its text fields "
                                         r"are text, note; name the field"):
        adapt(Game)
    with pytest.raises(ValueError, match=r"`rollout.env_observation`: Board .* its text fields are board, hint"):
        adapt(Game, action="text")
    with pytest.raises(ValueError, match=r"`rollout.env_action`='txt': Move has no field 'txt' \(its fields: text, note\)"):
        adapt(Game, action="txt", observation="board")
    episode = adapt(Game, action="text", observation="hint")()
    assert episode.reset({"prompt": "p", "level": 2}, 7) == "pick a, b or c"
    target = random.Random(7).choice("abc")
    wrong = next(c for c in "abc" if c != target)
    assert episode.step(wrong) == ("no", 0.0, False)  # reward None is 0
    assert episode.step(f" {target}\n") == (None, True, True)  # done: no next turn
    assert episode.env.seen == [("reset", 7, 2), ("step", wrong), ("step", f" {target}\n")]


def test_a_text_the_action_refuses_is_told_to_the_model_and_functions_map_it(tmp_path):
    hooks = tmp_path / "hooks_openenv_abc.py"
    hooks.write_text(textwrap.dedent("""
        from test_openenv import to_strict

        def parse(text):
            return to_strict(text)

        def render(obs):
            return obs.board.upper()
    """))
    with pytest.raises(ValueError, match=r"does not say which Action it takes"):
        adapt(Unannotated)
    episode = adapt(Unannotated, action=f"{hooks}:parse", observation=f"{hooks}:render")()
    assert episode.reset({}, 0) == "START"
    reply, reward, done = episode.step("three")
    assert reply.startswith("That action could not be read: ") and "digit" in reply and (reward, done) == (0.0, False)
    assert episode.step("2") == ("GOT 2", 0.5, False)
    assert episode.step("3") == (None, 0.5, True)
    found = adapt(Unannotated, action=f"{hooks}:parse", observation="board")()  # named on the first observation
    assert found.reset({}, 0) == "start"
    with pytest.raises(ValueError, match=r"Board is the environment's Observation, and its text fields are board, hint"):
        adapt(Unannotated, action=f"{hooks}:parse")().reset({}, 0)


@pytest.mark.slow  # workers each import openenv (about 3 s: its server's web interface); .ci/run runs it
def test_the_workers_play_the_episodes_the_environment_plays_by_hand():
    import sys

    sys.path.insert(0, str(ROOT / "examples" / "environments"))
    from openenv_guess import GuessAction, GuessEnv

    pool = EnvPool(EnvSpec(GUESS), workers=2, timeout_s=30)
    try:
        started = pool.start([{"prompt": "x"}] * 3, [11, 12, 13], samples=2)
        assert [s.first for s in started] == ["Guess my number, 0 to 9. Answer with one digit.\n"] * 6
        texts = ["5", "no digit", "2", "7", "9", "0"]
        got = pool.step([(s.eid, t) for s, t in zip(started, texts)])
    finally:
        pool.close()
    for k, (text, step) in enumerate(zip(texts, got)):
        env = GuessEnv()
        env.reset(seed=[11, 12, 13][k // 2])
        obs = env.step(GuessAction(guess=text))
        assert (step[1], step[2]) == (obs.reward, obs.done)
        assert step[0] == (None if obs.done else obs.message)


@pytest.mark.slow  # workers each import openenv (about 3 s: its server's web interface); .ci/run runs it
def test_a_run_on_an_openenv_environment_trains_on_its_step_rewards(tmp_path):
    tr = PPOTrainer(tiny_config(tmp_path, rollout__env=GUESS, rollout__max_turns=3, rollout__num_prompts=4,
                                rollout__max_new_tokens=3, iterations=1))
    metrics = tr.train_iteration(1).metrics
    assert "step_reward_mean" in metrics and -0.31 <= metrics["score_min"] <= metrics["score_max"] <= 1.21


@pytest.mark.slow  # workers each import openenv (about 3 s: its server's web interface); .ci/run runs it
def test_mapping_errors_are_one_line_before_any_model(tmp_path, no_model_loads):
    with pytest.raises(ConfigError, match=r"`rollout.env_observation`='text': GuessObservation has no field 'text'"):
        PPOTrainer(tiny_config(tmp_path, rollout__env=GUESS, rollout__env_observation="text"))
    with pytest.raises(ConfigError, match=r"`rollout.env_action`='guess' is unused: `rollout.env` is not set"):
        PPOTrainer(tiny_config(tmp_path, rollout__env_action="guess"))


def test_without_openenv_the_error_names_the_extra(tmp_path):
    env = tmp_path / "needs_openenv_abc.py"
    env.write_text("import openenv_is_not_here_abc as openenv\n")
    with pytest.raises(ValueError, match="No module named"):
        load_env(EnvSpec(f"{env}:X"))
    env.write_text("raise ModuleNotFoundError(\"No module named 'openenv'\", name='openenv')\n")
    with pytest.raises(ValueError, match=r"an OpenEnv environment needs the openenv package: pip install 'ppo-lm\[openenv\]'"):
        load_env(EnvSpec(f"{env}:X"))


def test_a_raising_environment_is_the_runs_error_with_its_own_lines():
    class Broken(Game):
        def step(self, action: Move, timeout_s=None, **kwargs) -> Board:
            raise RuntimeError("the board fell over")

    from ppo_lm.rollout.envs.environment import call_user

    episode = adapt(Broken, action="text", observation="board")()
    episode.reset({}, 1)
    with pytest.raises(EnvError, match="the environment's step raised RuntimeError: the board fell over"):
        call_user(episode.step, "a", what="step")


def test_the_echo_example_pays_each_word_said_back():
    """examples/environments/openenv_echo.py (the measured OpenEnv example): three words from the seed,
    1 for each said back anywhere in the reply, 0 else, done after the third; the adapter's text view."""
    echo = load_env(f"{ROOT / 'examples' / 'environments' / 'openenv_echo.py'}:EchoEnv")  # adapted as it loads
    env = echo()
    first = env.reset({}, 7)
    word = first.rsplit(" ", 1)[-1]
    assert first.startswith("Repeat this word exactly") and word.isalpha()
    obs, reward, done = env.step(f"Sure: {word.upper()}!")
    assert reward == 1.0 and not done and obs.startswith("Right. Repeat")
    second = obs.rsplit(" ", 1)[-1]
    obs, reward, done = env.step("something else")
    assert reward == 0.0 and not done and obs.startswith(f"No, the word was {second}.")
    assert env.step("x")[1:] == (0.0, True) and echo().reset({}, 7) == first
