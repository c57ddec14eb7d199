"""Where a user's environment runs (docs/environments.md, "Where the environment runs"): worker
processes the pool kills at `rollout.env_timeout_s` — code blocked in C included, from any thread, with
a tool call's own limit nested inside a step's — and one group of episodes plays one task."""

from __future__ import annotations

import json
import textwrap
import threading
import time
from pathlib import Path

import pytest
from trainer_helpers import tiny_config

from ppo_lm.cli.main import main
from ppo_lm.rollout.envs.env_pool import EnvPool
from ppo_lm.rollout.envs.environment import EnvError
from ppo_lm.rollout.envs.tools import run_tool_call
from ppo_lm.trainer.ppo import PPOTrainer

ENVS = '''
import json
import os
import time

from ppo_lm.rollout.envs.tools import ToolEnv


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
    assert sorted(by_seed) == tr.plan.seeds_for(1)
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
    pool.open()
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


# ----------------------------------------------------------------------------- what the review found
def _running(marker: str) -> list[str]:
    """Command lines of live processes that hold ``marker`` (zombies aside)."""
    import os
    from pathlib import Path

    found = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and marker in (proc / "cmdline").read_bytes().decode(errors="replace") \
                    and " Z " not in (proc / "stat").read_text():
                found.append((proc / "cmdline").read_bytes().decode(errors="replace"))
        except OSError:
            continue
    return [c for c in found if str(os.getpid()) not in c]


MORE = '''
import os
import subprocess
import sys
import time

from ppo_lm.rollout.envs.tools import ToolEnv

RECORD = os.environ.get("RECORD")
if RECORD:
    with open(RECORD, "a") as f:
        f.write(f"import {os.getpid()}\\n")


class Spawner:
    """Its step starts a subprocess, prints, then hangs."""

    def reset(self, row, seed):
        return "go"

    def step(self, text):
        subprocess.Popen(["sleep", os.environ["MARKER"]])
        print("hello from the environment", flush=False)
        time.sleep(600)


class Echo:
    def reset(self, row, seed):
        self.n = 0
        return "go"

    def step(self, text):
        self.n += 1
        if RECORD:
            with open(RECORD, "a") as f:
                f.write(f"step {os.getpid()} {os.environ.get('PYTHONPATH')}\\n")
        return f"you said {self.n}", 1.0, self.n >= 3


class Slow(Echo):
    def step(self, text):
        time.sleep(1.5)
        return super().step(text)


def starts(seconds: str) -> str:
    """Start a subprocess and wait for it.

    Args:
        seconds: how long it sleeps
    """
    subprocess.run(["sleep", seconds])
    return "never"


def leaves(seconds: str) -> str:
    """Start a subprocess and return at once.

    Args:
        seconds: how long it sleeps
    """
    subprocess.Popen(["sleep", seconds])
    return "left it"


class Where(Echo):
    def step(self, text):
        import ppo_lm

        return ppo_lm.__file__, 1.0, True


class Tooled(ToolEnv):
    tools = [leaves]

    def prompt(self, row):
        return [{"role": "user", "content": "x"}]

    def reward(self, text):
        return 0.0
'''


@pytest.fixture
def more(tmp_path):
    f = tmp_path / "more_envs.py"
    f.write_text(MORE)
    return f


def test_the_module_is_imported_in_workers_only(tmp_path, more, monkeypatch, capsys):
    """The trainer never imports the environment's module (a module that hangs or starts processes when
    imported would do it in the trainer, out of any limit); the workers see the trainer's variables."""
    import os
    import sys

    record = tmp_path / "record.txt"
    monkeypatch.setenv("RECORD", str(record))
    assert main(["train", "--iterations", "1", "--log.no-tensorboard", "--rollout.num-prompts", "4",
                 "--rollout.env", f"{more}:Echo", "--output-dir", str(tmp_path / "run")]) == 0
    lines = record.read_text().splitlines()
    assert lines and all(str(os.getpid()) not in line for line in lines)
    assert not any("more_envs" in name for name in sys.modules)
    assert {line.split(" ", 2)[2] for line in lines if line.startswith("step")} == {str(os.environ.get("PYTHONPATH"))}


def test_a_killed_trainer_leaves_nothing_running(tmp_path, more):
    """SIGKILL of the trainer while a step hangs: the worker's watchdog kills the worker and what the
    environment started (before, the worker died but its subprocess lived on)."""
    import os
    import signal
    import subprocess
    import sys

    marker = "987.654321"
    script = tmp_path / "run.py"
    script.write_text(textwrap.dedent(f"""
        from ppo_lm.rollout.envs.env_pool import EnvPool
        pool = EnvPool("{more}:Spawner", workers=1, timeout_s=600)
        (st,) = pool.start([{{"prompt": "x"}}], [0], 1)
        print("started", flush=True)
        pool.step([(st.eid, "go")])
    """))
    log = tmp_path / "out.txt"
    with open(log, "w") as out:
        trainer = subprocess.Popen([sys.executable, str(script)], stdout=out, stderr=subprocess.STDOUT,
                                   env={**os.environ, "MARKER": marker, "PYTHONUNBUFFERED": ""})
        deadline = time.monotonic() + 30
        while not _running(marker) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _running(marker), log.read_text()
        time.sleep(0.3)
        trainer.send_signal(signal.SIGKILL)
        trainer.wait()
    deadline = time.monotonic() + 10
    while _running(marker) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _running(marker)
    assert "hello from the environment" in log.read_text()  # what it printed reached the file


def test_a_tool_call_takes_what_it_started_along(more):
    """Past its limit, or returned: what a call started ends with it (each call has a process group)."""
    import sys

    sys.path.insert(0, str(more.parent))
    try:
        import more_envs
    finally:
        sys.path.pop(0)
    marker = "986.123"
    out = run_tool_call({"starts": more_envs.starts}, {"name": "starts", "arguments": {"seconds": marker}}, 0.5)
    assert out == "error: starts ran past its time limit of 0.5 s"
    time.sleep(0.3)
    assert not _running(marker)
    marker = "985.123"
    assert run_tool_call({"leaves": more_envs.leaves}, {"name": "leaves", "arguments": {"seconds": marker}}, 5) == \
        "left it"
    time.sleep(0.3)
    assert not _running(marker)


def test_descriptors_numbered_past_1024_and_the_trainers_own_ppo_lm(tmp_path, more):
    """A trainer holding many files passes high descriptor numbers to its workers (select() refuses
    them); a trainer that imported ppo_lm from a checkout of its own has its workers import the same."""
    import os
    import shutil
    import subprocess
    import sys

    import ppo_lm

    copy = tmp_path / "checkout"
    shutil.copytree(Path(ppo_lm.__file__).parent, copy / "ppo_lm", ignore=shutil.ignore_patterns("__pycache__"))
    script = tmp_path / "run.py"
    script.write_text(textwrap.dedent(f"""
        import os, resource, sys
        sys.path.insert(0, {str(copy)!r})
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft < 1200:  # a default soft limit of 1024 would refuse the files below
            resource.setrlimit(resource.RLIMIT_NOFILE, (min(4096, hard) if hard != resource.RLIM_INFINITY else 4096, hard))
        held = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]
        from ppo_lm.rollout.envs.env_pool import EnvPool
        pool = EnvPool({str(more) + ":Where"!r}, workers=1, timeout_s=30)
        (st,) = pool.start([{{"prompt": "x"}}], [0], 1)
        print(pool.step([(st.eid, "go")])[0][0])
        pool.close()
        pool = EnvPool({str(more) + ":Tooled"!r}, workers=1, timeout_s=30)
        (st,) = pool.start([{{"prompt": "x"}}], [0], 1)
        call = '<tool_call>{{"name": "leaves", "arguments": {{"seconds": "1"}}}}</tool_call>'
        print(pool.step([(st.eid, call)])[0][0][0]["content"])  # the watchdog heard of the call's group
        pool.close()
    """))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120,
                          env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == [str(copy / "ppo_lm" / "__init__.py"), "left", "it"]


def test_the_pool_survives_what_used_to_break_it(tmp_path, more, monkeypatch):
    """Started from a thread that then ends; an interrupt in the middle of a call; a worker gone between
    calls; a limit of days."""
    import os
    import signal

    holder = {}
    thread = threading.Thread(target=lambda: holder.update(pool=EnvPool(f"{more}:Slow", workers=1, timeout_s=1e9)))
    thread.start()
    thread.join()
    pool = holder["pool"]
    (st,) = pool.start([{"prompt": "x"}], [0], 1)
    assert pool.step([(st.eid, "a")])[0][0] == "you said 1"  # the thread's end did not take the worker

    def interrupt(*_):
        raise KeyboardInterrupt

    before = signal.signal(signal.SIGALRM, interrupt)
    signal.setitimer(signal.ITIMER_REAL, 0.3)
    try:
        with pytest.raises(KeyboardInterrupt):
            pool.step([(st.eid, "b")])
    finally:
        signal.signal(signal.SIGALRM, before)
    (st,) = pool.start([{"prompt": "x"}], [0], 1)  # fresh workers, no reply of the interrupted call left
    assert pool.step([(st.eid, "c")])[0][0] == "you said 1"
    os.killpg(pool._workers[0].proc.pid, signal.SIGKILL)
    pool._workers[0].proc.wait()
    pool.drop([st.eid])  # the episode is over; the worker's end is news for the next call
    with pytest.raises(EnvError, match="worker process ended"):
        pool.start([{"prompt": "x"}], [0], 1)
    pool.close()
    with pytest.raises(EnvError, match="workers were stopped"):
        pool.step([(st.eid, "d")])


def test_a_file_in_the_working_directory_does_not_shadow_the_workers_modules(tmp_path, more, monkeypatch):
    here = tmp_path / "cwd"
    here.mkdir()
    (here / "select.py").write_text("raise ImportError('the wrong select')\n")
    monkeypatch.chdir(here)
    pool = EnvPool(f"{more}:Echo", workers=1, timeout_s=10)
    (st,) = pool.start([{"prompt": "x"}], [0], 1)
    assert pool.step([(st.eid, "a")])[0][0] == "you said 1"
    pool.close()


def test_what_crosses_to_the_trainer_is_plain_data():
    import numpy as np

    from ppo_lm.rollout.envs.environment import check_step

    class Tag:
        pass

    with pytest.raises(EnvError, match="holding something other than str, numbers"):
        check_step(([{"role": "user", "content": "x", "meta": Tag()}], 0.0, False))
    assert check_step(([{"role": "user", "content": "x", "meta": {"k": [1, 2.5, None]}}], 0.0, False))[2] is False
    assert check_step((None, np.float32(0.5), np.True_)) == (None, 0.5, True)
