"""An OpenEnv environment over its own server (OpenEnv's FastAPI app under uvicorn, on 127.0.0.1, started
and stopped here) through OpenEnv's own client: the same episodes as in-process for the same seeds and
texts, a server allowing one session played in waves, a refusal past its limit and a server killed
mid-iteration each one line, an unreachable server named before any model loads."""

from __future__ import annotations

import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import requests
from trainer_helpers import tiny_config

from ppo_lm.rollout.envs.env_pool import EnvPool
from ppo_lm.rollout.envs.environment import EnvError, EnvSpec
from ppo_lm.runtime.errors import ConfigError
from ppo_lm.trainer.ppo import PPOTrainer

ROOT = Path(__file__).resolve().parents[1]
GUESS = f"{ROOT / 'examples' / 'environments' / 'openenv_guess.py'}:GuessEnv"
SERVE = textwrap.dedent(f"""
    import sys
    sys.path.insert(0, {str(ROOT / 'examples' / 'environments')!r})
    import uvicorn
    from openenv.core.env_server import create_fastapi_app
    from openenv_guess import GuessAction, GuessEnv, GuessObservation

    app = create_fastapi_app(GuessEnv, GuessAction, GuessObservation, max_concurrent_envs=int(sys.argv[2]))
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
""")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """OpenEnv's server of the example game, allowing ``sessions`` at once."""

    def __init__(self, tmp_path: Path, sessions: int):
        self.port = _free_port()
        script = tmp_path / "serve_guess.py"
        script.write_text(SERVE)
        self.proc = subprocess.Popen([sys.executable, str(script), str(self.port), str(sessions)])
        deadline = time.monotonic() + 60
        while True:
            try:
                if requests.get(f"http://127.0.0.1:{self.port}/health", timeout=1).ok:
                    break
            except requests.RequestException:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the OpenEnv server did not start")
            time.sleep(0.2)
        self.url = f"openenv+ws://127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()


@pytest.fixture
def server(tmp_path, request):
    s = Server(tmp_path, getattr(request, "param", 2))
    yield s
    s.stop()


def _play(spec: str, seeds: list[int], texts: list[list[str]]) -> list:
    pool = EnvPool(EnvSpec(spec), workers=1, timeout_s=30)
    try:
        started = pool.start([{"prompt": "x"}] * len(seeds), seeds, samples=1)
        out = [[s.first for s in started]]
        for turn in texts:
            out.append(pool.step([(s.eid, t) for s, t in zip(started, turn)]))
        pool.drop([s.eid for s in started])
        return out
    finally:
        pool.close()


@pytest.mark.slow  # a server and two pools start (OpenEnv imports in about 3 s each); .ci/run runs it
def test_the_server_and_in_process_play_the_same_episodes(server):
    texts = [["5", "no digit"], ["3", "8"], ["4", "9"]]
    over_server = _play(server.url, [11, 12], texts)
    assert over_server == _play(GUESS, [11, 12], texts)
    assert over_server[1][1] == ("One digit, please:\n", -0.1, False)


@pytest.mark.slow
@pytest.mark.parametrize("server", [1], indirect=True)
def test_a_server_of_one_session_plays_eight_episodes_in_waves_and_more_is_refused_in_one_line(server, tmp_path):
    cfg = tiny_config(tmp_path / "a", rollout__env=server.url, rollout__env_sessions=1, rollout__num_prompts=8,
                      rollout__max_turns=2, rollout__max_new_tokens=3, rollout__env_workers=1, iterations=1)
    metrics = PPOTrainer(cfg).train_iteration(1).metrics
    assert "step_reward_mean" in metrics
    cfg = tiny_config(tmp_path / "b", rollout__env=server.url, rollout__num_prompts=8, rollout__max_turns=2,
                      rollout__max_new_tokens=3, rollout__env_workers=1, iterations=1)
    with pytest.raises(EnvError, match=r"set `rollout.env_sessions` to the limit of the OpenEnv server at .* \(its "
                                        r"max_concurrent_envs\): it refused a session 6 times over 7.75 s \(Server "
                                        r"error: Server at capacity: 1/1"):
        PPOTrainer(cfg).train_iteration(1)


@pytest.mark.slow
def test_a_server_killed_mid_iteration_is_one_line(server):
    pool = EnvPool(EnvSpec(server.url), workers=1, timeout_s=30)
    try:
        started = pool.start([{"prompt": "x"}], [3], samples=1)
        server.stop()
        with pytest.raises(EnvError, match=r"the OpenEnv server at .* went away during the step .*resume with "
                                           r"--resume") as e:
            pool.step([(started[0].eid, "4")])
        assert "\n" not in str(e.value)
    finally:
        pool.close()


def test_an_unreachable_server_is_one_line_before_any_model(tmp_path, no_model_loads):
    url = f"openenv+ws://127.0.0.1:{_free_port()}"
    with pytest.raises(ConfigError, match=r"`rollout.env`='openenv\+ws://127.0.0.1:\d+': the OpenEnv server does not "
                                          r"answer \(ConnectionError: .*\); start it, or check the address"):
        PPOTrainer(tiny_config(tmp_path, rollout__env=url))


def test_sessions_hold_whole_groups(tmp_path):
    from ppo_lm.config.validate import validate_config

    with pytest.raises(ConfigError, match=r"`rollout.env_sessions`=2 is below `rollout.samples_per_prompt` \(4\)"):
        validate_config(tiny_config(tmp_path, rollout__env=GUESS, rollout__env_sessions=2,
                                    algo__estimator="grpo", rollout__samples_per_prompt=4))
