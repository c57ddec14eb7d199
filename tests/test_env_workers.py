"""Where a user's environment runs (docs/environments.md, "Where the environment runs"): worker
processes the pool kills at `rollout.env_timeout_s` — code blocked in C included, from any thread, with
a tool call's own limit nested inside a step's — and one group of episodes plays one task."""

from __future__ import annotations

import json
import textwrap
import threading
import time

import pytest
from trainer_helpers import tiny_config

from ppo_lm.cli.main import main
from ppo_lm.rollout.env_pool import EnvPool
from ppo_lm.rollout.environment import EnvError
from ppo_lm.rollout.tools import run_tool_call
from ppo_lm.trainer.ppo import PPOTrainer

ENVS = '''
import json
import os
import time

from ppo_lm.rollout.tools import ToolEnv


class Busy:
    """Its step computes in C (one call to sum): no signal handler runs until it returns."""

    def reset(self, row, seed):
        return "go"

    def step(self, text):
        return None, float(sum(range(10 ** 10)) > 0), True


class Logged:
    """Appends [seed, sample] of each reset to $SEEDS_LOG."""

    def reset(self, row, seed, sample):
        with open(os.environ["SEEDS_LOG"], "a") as f:
            f.write(json.dumps([seed, sample, row["prompt"]]) + "\\n")
        return row["prompt"]

    def step(self, text):
        return None, 1.0, True


class Plain(Logged):
    """A reset without `sample`: the index is not passed."""

    def reset(self, row, seed):
        return super().reset(row, seed, None)


def nap(seconds: float) -> str:
    """Sleep a while.

    Args:
        seconds: how long
    """
    time.sleep(seconds)
    return "rested"


class Napper(ToolEnv):
    """Every call of a step takes 0.4 s: under its own limit, over the step's limit together."""

    tools = [nap]
    tool_timeout_s = 1.0

    def prompt(self, row):
        return [{"role": "user", "content": "nap"}]

    def reward(self, text):
        return 0.0


class HangsLater:
    """Hangs (in C) from its fifth reset on: the second iteration of a run of 4 episodes."""

    resets = 0

    def reset(self, row, seed):
        type(self).resets += 1
        self.hang = type(self).resets > 4 and not os.environ.get("NO_HANG")
        return row["prompt"]

    def step(self, text):
        if self.hang:
            sum(range(10 ** 10))
        return None, 1.0, True
'''


@pytest.fixture
def envs(tmp_path):
    f = tmp_path / "envs.py"
    f.write_text(ENVS)
    return f


def test_a_step_blocked_in_c_is_stopped_at_its_limit_from_any_thread(envs):
    """sum(range(10**10)) holds the interpreter for minutes; SIGALRM could not stop it, nor run off the
    main thread. The pool kills the worker at the limit, from a thread of its own."""
    pool = EnvPool(f"{envs}:Busy", workers=1, timeout_s=0.5)
    (st,) = pool.start([{"prompt": "x"}], [0], 1)
    caught = {}

    def run():
        started = time.monotonic()
        try:
            pool.step([(st.eid, "go")])
        except EnvError as e:
            caught["error"], caught["s"] = str(e), time.monotonic() - started

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(30)
    assert "the environment's step ran past its time limit of 0.5 s" in caught["error"]
    assert caught["s"] < 5, caught
    assert not pool._workers  # every worker stopped: the run is over


def test_nested_limits_hold(envs):
    """A ToolEnv step making 8 calls of 0.4 s (each under its 1 s tool limit) under a 1 s step limit:
    the step's limit holds (before, each inner timer replaced the outer one: 3.2 s, no error)."""
    pool = EnvPool(f"{envs}:Napper", workers=1, timeout_s=1.0)
    (st,) = pool.start([{"prompt": "x"}], [0], 1)
    calls = '<tool_call>{"name": "nap", "arguments": {"seconds": 0.4}}</tool_call>' * 8
    started = time.monotonic()
    with pytest.raises(EnvError, match="step ran past its time limit of 1 s"):
        pool.step([(st.eid, calls)])
    assert time.monotonic() - started < 2.5
    pool.close()


def test_a_tool_blocked_in_c_is_answered_at_its_limit():
    def crunch(n: int) -> int:
        """Add up.

        Args:
            n: how far
        """
        return sum(range(n))

    started = time.monotonic()
    out = run_tool_call({"crunch": crunch}, {"name": "crunch", "arguments": {"n": 2 * 10**9}}, 0.2)
    assert out == "error: crunch ran past its time limit of 0.2 s" and time.monotonic() - started < 1.5
    assert run_tool_call({"crunch": crunch}, {"name": "crunch", "arguments": {"n": 4}}, 5.0) == "6"


def test_a_group_plays_one_task(tmp_path, envs, monkeypatch):
    """GRPO's G episodes of one row share the row's seed (one task) and get their index in the group
    as `sample`; different rows get different seeds. A reset without `sample` is called without it."""
    log = tmp_path / "seeds.jsonl"
    monkeypatch.setenv("SEEDS_LOG", str(log))
    kw = dict(algo__estimator="grpo", rollout__samples_per_prompt=4, rollout__num_prompts=3,
              rollout__max_new_tokens=2, rollout__env_workers=2)
    tr = PPOTrainer(tiny_config(tmp_path / "run", rollout__env=f"{envs}:Logged", **kw))
    tr.rollout(1)
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(rows) == 12
    by_seed = {}
    for seed, sample, prompt in rows:
        by_seed.setdefault(seed, []).append((sample, prompt))
    assert sorted(by_seed) == tr.episode_seeds(1)
    for group in by_seed.values():
        assert sorted(s for s, _ in group) == [0, 1, 2, 3] and len({p for _, p in group}) == 1
    log.unlink()
    PPOTrainer(tiny_config(tmp_path / "plain", rollout__env=f"{envs}:Plain", **kw)).rollout(1)
    assert {json.loads(line)[1] for line in log.read_text().splitlines()} == {None}


def test_the_run_stops_in_one_line_with_its_checkpoints_intact(tmp_path, envs, capsys, monkeypatch):
    run = tmp_path / "run"
    base = ["train", "--iterations", "2", "--log.no-tensorboard", "--rollout.num-prompts", "4", "--log.save-every", "1",
            "--rollout.env", f"{envs}:HangsLater", "--rollout.env-workers", "1", "--output-dir", str(run)]
    started = time.monotonic()
    assert main([*base, "--rollout.env-timeout-s", "1"]) == 2
    err = capsys.readouterr().err
    assert "the environment's step ran past its time limit of 1 s" in err and "Traceback" not in err, err
    assert time.monotonic() - started < 60
    assert [p.name for p in (run / "checkpoints").iterdir() if p.name.startswith("iter")] == ["iter_000001"]
    monkeypatch.setenv("NO_HANG", "1")
    assert main([*base, "--resume"]) == 0
    assert "resumed from the checkpoint of iteration 1" in capsys.readouterr().out


def test_workers_do_not_outlive_the_pool(envs):
    pool = EnvPool(f"{envs}:Plain", workers=2, timeout_s=5)
    pool._ensure_started()
    procs = [w.proc for w in pool._workers]
    assert all(p.poll() is None for p in procs)
    del pool
    import gc

    gc.collect()
    assert all(p.poll() is not None for p in procs)


BAD = {
    "multi-line message": ("raise ValueError('first line\\n' + 'more\\n' * 10)", "raised ValueError: first line …"),
    "a number as a string": ("return None, '0.5', True", "a reward of type str ('0.5'); give a number"),
    "exits": ("import os; os._exit(3)", "worker process ended (exit code 3) during its step"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_more_environment_errors_are_one_line(tmp_path, capsys, case):
    body, message = BAD[case]
    f = tmp_path / "bad_env.py"
    f.write_text(textwrap.dedent(f"""
        class Bad:
            def reset(self, row, seed):
                return row["prompt"]

            def step(self, text):
                {body}
    """))
    code = main(["train", "--iterations", "1", "--log.no-tensorboard", "--rollout.num-prompts", "4",
                 "--rollout.env", f"{f}:Bad", "--output-dir", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert code == 2 and message in err and "Traceback" not in err, err
    assert "\nmore" not in err  # the message's first line only (its source line shows in the frames)
