"""Fault injection: the trainer is SIGKILLed at seeded-random moments — in the rollout, in the update,
at each step of writing a checkpoint — and resumed each time with the same ``--auto-resume`` command
(the idiom of preemptible clusters). The finished run must equal an uninterrupted one: every
non-timing metric and the final policy and critic weights, bit for bit. A real failed write (a file
size limit, which the OS enforces as it would a full disk) stops the run with one line and keeps the
previous checkpoint.

Kills in the rollout or the update are timed: once checkpoint N appears, iteration N+1 is running,
and the process's own timings of iteration N (in metrics.jsonl) say how long its rollout and update
take. Kills inside a save use the trainer's test hook ``PPO_LM_TEST_KILL_AT=ITERATION:POINT``
(``ppo_lm.trainer.checkpoint.folders.kill_point``). ``PPO_LM_FAULT_SEED`` picks another random plan.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ppo_lm.records.metrics_log import is_timing_key
from ppo_lm.trainer.checkpoint.folders import checkpoint_dir, list_checkpoints, verify

pytestmark = pytest.mark.slow

SEED = int(os.environ.get("PPO_LM_FAULT_SEED", "12"))
ITERATIONS = 14
# Big enough that a rollout (~0.2 s) and an update (~0.4 s) are windows a timed kill can hit on 2 cores.
ARGS = (
    "--threads 1 --model.builtin-hidden-size 128 --data.builtin-num-prompts 256 --rollout.num-prompts 64 "
    "--rollout.max-new-tokens 32 --optim.epochs 2 --log.save-every 1 --log.keep-last 1 --log.no-progress "
    "--log.no-tensorboard --critic.kind separate"  # a critic model of its own: its save is a kill point too
).split()
# Where a save can be killed, in the order it gets there (see state.save_checkpoint and checkpoint.commit).
SAVE_POINTS = ("begin", "policy", "critic", "trainer_state", "fsync", "manifest", "publish", "prune")
PUBLISHED = ("publish", "prune")  # killed after the new checkpoint was renamed into place
ENV = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")


# The tiny settings of the other tests, where timing does not matter.
SMALL = (
    "--threads 1 --model.builtin-hidden-size 32 --data.builtin-num-prompts 64 --rollout.num-prompts 8 "
    "--rollout.max-new-tokens 4 --optim.epochs 1 --log.save-every 1 --log.no-progress --log.no-tensorboard "
    "--critic.kind separate"
).split()
# ppo-lm under a file size limit: a write past it fails with EFBIG, as one fails with ENOSPC on a full disk
LIMITED = (
    "import resource, runpy, signal, sys; signal.signal(signal.SIGXFSZ, signal.SIG_IGN); "
    "resource.setrlimit(resource.RLIMIT_FSIZE, (int(sys.argv.pop(1)), resource.getrlimit("
    "resource.RLIMIT_FSIZE)[1])); sys.argv[0] = 'ppo-lm'; runpy.run_module('ppo_lm', run_name='__main__')"
)


def _command(run: Path, iterations: int = ITERATIONS, args: list[str] = ARGS) -> list[str]:
    train = ["train", "--output-dir", str(run), "--iterations", str(iterations), "--auto-resume"]
    return [sys.executable, "-m", "ppo_lm", *train, *args]


def _launch(command: list[str], **env) -> subprocess.CompletedProcess:
    return subprocess.run(command, env=dict(ENV, **env), capture_output=True, text=True, timeout=300)


def _finish(run: Path, iterations: int = ITERATIONS, args: list[str] = ARGS) -> None:
    proc = _launch(_command(run, iterations, args))
    assert proc.returncode == 0, proc.stderr[-3000:]


def _rows(run: Path) -> list[dict]:
    path = run / "metrics.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.is_file() else []


def _metrics(run: Path) -> list[dict]:
    return [{k: v for k, v in r.items() if not is_timing_key(k)} for r in _rows(run)]


def _newest(run: Path) -> int:
    found = list_checkpoints(run)
    return found[-1][0] if found else 0


def _weights(run: Path) -> dict[str, bytes]:
    ((it, path),) = list_checkpoints(run)  # keep_last 1
    assert it == ITERATIONS
    return {
        f"{m}/model.safetensors": (path / m / "model.safetensors").read_bytes() for m in ("policy", "critic")
    }


def _check_checkpoints(run: Path, before: int) -> None:
    """After any kill: no checkpoint lost (the newest is at least the one before), and every checkpoint
    resume can see is intact."""
    found = list_checkpoints(run)
    assert found and found[-1][0] >= before, (before, found)
    for _, path in found:
        assert verify(path) is None, (path, verify(path))


class _Attempt:
    """One launch of the run's command, to be killed."""

    def __init__(self, run: Path, log: Path, env: dict | None = None):
        self.run, self.log = run, log
        with open(log, "w") as out:
            self.proc = subprocess.Popen(_command(run), env=env or ENV, stdout=out, stderr=subprocess.STDOUT)

    def wait_for(self, condition, what: str, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            if self.proc.poll() is not None:
                pytest.fail(
                    f"the trainer exited ({self.proc.returncode}) before {what}:\n"
                    f"{self.log.read_text()[-3000:]}"
                )
            if time.monotonic() > deadline:
                self.proc.kill()
                pytest.fail(f"timed out waiting for {what}")
            time.sleep(0.003)

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        assert self.proc.wait(timeout=60) == -signal.SIGKILL


def _kill_mid_iteration(run: Path, log: Path, phase: str, rng: random.Random) -> dict:
    """Start the run, let it finish and save one iteration N, then kill it in iteration N+1's rollout or
    update: the delay after checkpoint N appears is a random share of that phase as iteration N timed it."""
    start = _newest(run)
    target = start + 1
    att = _Attempt(run, log)
    att.wait_for(lambda: _newest(run) >= target, f"checkpoint {target}")
    t0 = time.monotonic()
    row = _rows(run)[target - 1]
    assert row["iteration"] == target
    rollout = row["generate_s"] + row["score_s"]
    if phase == "rollout":
        delay = rng.uniform(0.1, 0.7) * rollout
    else:
        delay = rollout + row["advantage_s"] + rng.uniform(0.1, 0.6) * row["update_s"]
    time.sleep(max(0.0, t0 + delay - time.monotonic()))
    att.kill()
    # the iteration's metrics line is written when its update ends: none means the kill came before
    return {
        "kind": phase,
        "iteration": target + 1,
        "delay_s": round(delay, 3),
        "in_time": len(_rows(run)) == target,
        "from": start,
    }


def _kill_in_save(run: Path, log: Path, point: str) -> dict:
    start = _newest(run)
    target = start + 1
    att = _Attempt(run, log, env=dict(ENV, PPO_LM_TEST_KILL_AT=f"{target}:{point}"))
    assert att.proc.wait(timeout=120) == -signal.SIGKILL, log.read_text()[-3000:]
    assert _newest(run) == (target if point in PUBLISHED else start), (point, list_checkpoints(run))
    return {"kind": f"save:{point}", "iteration": target, "from": start}


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("uninterrupted") / "run"
    _finish(run)
    return run


def test_sigkill_anywhere_then_auto_resume_equals_an_uninterrupted_run(tmp_path, uninterrupted):
    rng = random.Random(SEED)
    plan = ["rollout"] * 4 + ["update"] * 4 + [f"save:{p}" for p in SAVE_POINTS]
    rng.shuffle(plan)
    # the first kill comes after checkpoint 1 (see test_a_kill_during_the_first_save_auto_resumes)
    first_timed = next(i for i, k in enumerate(plan) if not k.startswith("save:"))
    plan.insert(0, plan.pop(first_timed))
    run = tmp_path / "run"
    kills = []
    for n, kind in enumerate(plan):
        before = _newest(run)
        assert before + 2 <= ITERATIONS, f"the plan needs more than {ITERATIONS} iterations: {kills}"
        log = tmp_path / f"attempt{n:02d}.log"
        if kind.startswith("save:"):
            kills.append(_kill_in_save(run, log, kind.removeprefix("save:")))
        else:
            kills.append(_kill_mid_iteration(run, log, kind, rng))
        _check_checkpoints(run, before)
    _finish(run)

    summary = f"seed {SEED}: " + json.dumps(kills)
    print(summary)
    assert len(kills) >= 10
    assert {k["kind"] for k in kills} >= {"rollout", "update"}
    timed_late = [k for k in kills if not k.get("in_time", True)]  # after the iteration's update ended
    assert len(timed_late) <= 2, summary
    assert _metrics(run) == _metrics(uninterrupted), summary
    assert [r["iteration"] for r in _rows(run)] == list(range(1, ITERATIONS + 1))
    assert _weights(run) == _weights(uninterrupted), summary  # the saved files, byte for byte
    left = sorted(p.name for p in checkpoint_dir(run).iterdir())
    assert left == [f"iter_{ITERATIONS:06d}"]  # keep_last 1, and no .tmp-* directory left behind


def test_a_kill_during_the_first_save_auto_resumes(tmp_path):
    """Killed after iteration 1's metrics line but before checkpoint 1: --auto-resume starts over
    (the lines of the killed attempt are dropped, not repeated)."""
    run = tmp_path / "run"
    killed = _launch(_command(run, 2, SMALL), PPO_LM_TEST_KILL_AT="1:manifest")
    assert killed.returncode == -signal.SIGKILL and list_checkpoints(run) == []
    _finish(run, 2, SMALL)
    assert [r["iteration"] for r in _rows(run)] == [1, 2]


def test_a_failed_write_keeps_the_previous_checkpoint_and_stops_with_one_line(tmp_path):
    """Real writes that fail (not a stand-in for the writers): past a file size limit, safetensors'
    writer (model.safetensors, ~160 kB here) or torch's (trainer_state.pt, ~660 kB) gets EFBIG."""
    run = tmp_path / "run"
    _finish(run, 1, SMALL)
    message = (
        f"ppo-lm: error: could not write checkpoint 2 to {str(checkpoint_dir(run))!r}: File too large; "
        "the previous checkpoint (iteration 1) is intact; fix that and resume with --resume"
    )
    for limit in (100_000, 400_000):
        proc = _launch([sys.executable, "-c", LIMITED, str(limit), *_command(run, 2, SMALL)[3:]])
        assert proc.returncode == 2 and message in proc.stderr.splitlines(), proc.stderr[-3000:]
        assert "Traceback" not in proc.stderr
        assert sorted(p.name for p in checkpoint_dir(run).iterdir()) == ["iter_000001"]  # no .tmp-* left
        assert verify(checkpoint_dir(run) / "iter_000001") is None
    _finish(run, 2, SMALL)
    assert [r["iteration"] for r in _rows(run)] == [1, 2]
