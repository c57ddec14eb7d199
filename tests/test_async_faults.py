"""Fault injection for asynchronous PPO (docs/async.md, "Resume and failure"): the learner or the
producer's process is SIGKILLed at seeded-random moments — while the producer starts, mid-iteration,
while held-out evaluation runs between a publish and a save (so a checkpoint may hold k + 1 batches
ahead) — and the run is continued each time with the same ``--auto-resume`` command. The finished run
equals an uninterrupted one (every non-timing metric and the final weights, byte for byte); a killed
producer ends the learner with one line; a killed learner takes its producer with it; no weight box
is ever left in /dev/shm or the temporary folder. ``PPO_LM_FAULT_SEED`` picks another random plan."""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from test_fault_injection import ENV, _metrics, _newest, _rows

from ppo_lm.trainer.checkpoint.folders import list_checkpoints, verify

pytestmark = pytest.mark.slow

SEED = int(os.environ.get("PPO_LM_FAULT_SEED", "5"))
ITERATIONS = 20
ARGS = ("--threads 1 --model.builtin-hidden-size 64 --data.builtin-num-prompts 64 --rollout.num-prompts 8 "
        "--rollout.max-new-tokens 6 --optim.epochs 1 --log.save-every 1 --log.keep-last 2 --log.no-progress "
        "--log.no-tensorboard --rollout.max-staleness 2 --algo.off-policy-correction tis "
        "--data.eval-prompts builtin:equations --log.eval-every 3 --critic.warmup-iterations 0").split()


def _command(run: Path) -> list[str]:
    return [sys.executable, "-m", "ppo_lm", "train", "--output-dir", str(run), "--iterations", str(ITERATIONS),
            "--auto-resume", *ARGS]


def _boxes() -> set[str]:
    """Weight boxes anywhere one could be left (an earlier version kept a named file in /dev/shm)."""
    found = set()
    for folder in {"/dev/shm", tempfile.gettempdir()}:
        with contextlib.suppress(OSError):
            found |= {f"{folder}/{p}" for p in os.listdir(folder) if p.startswith("ppo-lm-weights")}
    return found


def _producer_of(pid: int) -> int | None:
    for proc in Path("/proc").iterdir():
        with contextlib.suppress(OSError):
            if proc.name.isdigit() and "producer_process" in (proc / "cmdline").read_text(errors="replace"):
                if (proc / "stat").read_text().rsplit(")", 1)[1].split()[1] == str(pid):
                    return int(proc.name)
    return None


def _gone(pid: int, timeout: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return True
        if state == "Z":
            return True
        time.sleep(0.05)
    return False


def _until(proc: subprocess.Popen, condition, what: str, log: Path, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if proc.poll() is not None:
            pytest.fail(f"the trainer exited ({proc.returncode}) before {what}:\n{log.read_text()[-3000:]}")
        if time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.005)


def _attempt(run: Path, log: Path, victim: str, rng: random.Random) -> dict:
    """Launch, then SIGKILL ``victim`` ('learner', 'producer', or 'start': the learner while its producer starts)."""
    before = _newest(run)
    with open(log, "w") as out:
        proc = subprocess.Popen(_command(run), env=ENV, stdout=out, stderr=subprocess.STDOUT)
    try:
        producer = None
        if victim == "start":  # the box exists from here until the producer says it is ready
            _until(proc, lambda: _producer_of(proc.pid) is not None, "the producer's start", log)
            producer = _producer_of(proc.pid)
            delay = rng.uniform(0.0, 2.0)
        else:
            _until(proc, lambda: _newest(run) > before, f"a checkpoint after {before}", log)
            producer = _producer_of(proc.pid)
            delay = rng.uniform(0.0, 0.3)  # about an iteration
        time.sleep(delay)
        if victim == "producer":
            os.kill(producer, signal.SIGKILL)
            code = proc.wait(timeout=60)
            text = log.read_text()
            assert code != 0, text[-2000:]
            assert "the producer's process ended (signal SIGKILL)" in text and "--resume" in text, text[-2000:]
            assert "Traceback" not in text, text[-3000:]
        else:
            proc.send_signal(signal.SIGKILL)
            assert proc.wait(timeout=60) == -signal.SIGKILL
            assert producer is None or _gone(producer), "the producer outlived its learner"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    found = list_checkpoints(run)  # none lost, every one intact (a kill at the first start: none yet)
    assert (found[-1][0] if found else 0) >= before and all(verify(path) is None for _, path in found), found
    return {"victim": victim, "delay_s": round(delay, 3), "from": before, "to": _newest(run)}


def test_sigkill_of_either_side_then_auto_resume_equals_an_uninterrupted_run(tmp_path):
    boxes = _boxes()
    whole = tmp_path / "whole"
    done = subprocess.run(_command(whole), env=ENV, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    rng = random.Random(SEED)
    plan = rng.sample(["learner", "producer", "start"], 3) + rng.sample(["learner", "producer", "start"], 3)
    run, kills = tmp_path / "run", []
    for n, victim in enumerate(plan):
        if _newest(run) + 2 > ITERATIONS:
            break
        kills.append(_attempt(run, tmp_path / f"attempt{n}.log", victim, rng))
        assert _boxes() == boxes, kills  # nothing left behind, whoever died and whenever
    finished = subprocess.run(_command(run), env=ENV, capture_output=True, text=True, timeout=300)
    assert finished.returncode == 0, finished.stderr[-3000:]
    summary = f"seed {SEED}: {kills}"
    print(summary)
    assert {k["victim"] for k in kills} == {"learner", "producer", "start"}, summary
    assert _metrics(run) == _metrics(whole), summary
    assert [r["iteration"] for r in _rows(run) if "score_mean" in r or "iteration" in r][-1] == ITERATIONS
    (_, a), (_, b) = list_checkpoints(whole)[-1], list_checkpoints(run)[-1]
    assert (a / "policy" / "model.safetensors").read_bytes() == (b / "policy" / "model.safetensors").read_bytes()
    assert _boxes() == boxes
