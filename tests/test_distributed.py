"""Data-parallel PPO under torchrun (gloo, 2 CPU processes) equals one process on the whole batch."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from dist_worker import build, fixed_rollout, save_reward_model, weights

from ppo_lm.trainer.checkpoint.folders import latest_checkpoint

HERE = Path(__file__).parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _torchrun(args: list[str], timeout: float, env_extra: dict | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(HERE), **(env_extra or {}))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
           "--master-addr", "127.0.0.1", "--master-port", str(_free_port()), *args]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("critic,mode", [("separate", "ddp"), ("shared", "ddp"),
                                         pytest.param("separate", "fsdp", marks=pytest.mark.slow)])
def test_two_ranks_match_one_process(tmp_path, critic, mode):
    """With FSDP the run also has a reward model: policy, critic, reference and reward model are all
    sharded, and the scores, reference KL and updated weights still match one process."""
    reward = save_reward_model(str(tmp_path / "rm")) if mode == "fsdp" else None
    args = [str(HERE / "dist_worker.py"), str(tmp_path / "dp"), critic, mode] + ([reward] if reward else [])
    proc = _torchrun(args, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    dp = torch.load(tmp_path / "dp" / "result.pt", weights_only=False)
    if reward:
        assert dp["sharded"] == {"policy": True, "critic": True, "ref": True, "reward_model": True}

    torch.set_num_threads(1)
    tr = build(str(tmp_path / "single"), critic, reward=reward)
    batch = fixed_rollout(tr)
    lengths = batch.response_mask.sum(1)
    assert lengths[:4].sum() != lengths[4:].sum(), "ranks must hold different token counts"
    single_metrics = tr.learn(batch, 1).metrics
    single = weights(tr)

    init = weights(build(str(tmp_path / "init"), critic, reward=reward))
    moved = max(float((single[k] - init[k]).abs().max()) for k in single)
    assert moved > 1e-4, "the update must change the weights for the comparison to mean anything"
    assert single.keys() == dp["weights"].keys()
    for k in single:
        assert torch.allclose(single[k], dp["weights"][k], atol=1e-5, rtol=0), k
    for k in ("policy_loss", "value_loss", "approx_kl", "entropy", "score", "ref_kl", "advantage_std", "ratio_max",
              "explained_variance", "value_mean", "return_mean", "policy_clip_frac", "approx_kl_k3"):
        if k in single_metrics:
            assert abs(single_metrics[k] - dp["metrics"][k]) < 1e-4, k


@pytest.mark.slow  # a torchrun launch: ~9 s of the fast suite's 4 minutes; .ci/run runs it
def test_rank_crash_stops_all_and_keeps_checkpoint(tmp_path):
    out = tmp_path / "run"
    t0 = time.monotonic()
    proc = _torchrun(
        ["-m", "ppo_lm", "train", "--output-dir", str(out), "--iterations", "4", "--model.builtin-hidden-size", "32",
         "--rollout.num-prompts", "8", "--rollout.max-new-tokens", "4", "--optim.epochs", "1",
         "--log.save-every", "1", "--log.no-progress", "--log.no-tensorboard",
         "--model.reward", "flaky_reward:crash_on_rank1"],
        timeout=240,
    )
    elapsed = time.monotonic() - t0
    assert proc.returncode != 0
    assert "injected failure on rank 1" in proc.stderr
    assert elapsed < 180
    found = latest_checkpoint(out)
    assert found is not None and found[0] == 1
    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_pretrained(found[1] / "policy")  # still loadable


def _train_args(out, iterations, *extra):
    return ["-m", "ppo_lm", "train", "--output-dir", str(out), "--iterations", str(iterations),
            "--model.builtin-hidden-size", "32", "--rollout.num-prompts", "8", "--rollout.max-new-tokens", "4",
            "--optim.epochs", "1", "--log.save-every", "1", "--log.no-progress", "--log.no-tensorboard",
            "--model.reward", "trainer_helpers:length_reward", "--critic.kind", "separate", *extra]


def _metric_rows(path):
    import json

    from ppo_lm.records.metrics_log import is_timing_key

    rows = [json.loads(x) for x in (path / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not is_timing_key(k)} for r in rows]


@pytest.mark.slow  # three torchrun launches: ~25 s of the fast suite's 4 minutes; .ci/run runs it
def test_fsdp_checkpoint_resume_equals_uninterrupted(tmp_path):
    full = _torchrun(_train_args(tmp_path / "full", 3, "--model.fsdp"), timeout=300)
    assert full.returncode == 0, full.stderr[-3000:]
    part = _torchrun(_train_args(tmp_path / "part", 2, "--model.fsdp"), timeout=300)
    assert part.returncode == 0, part.stderr[-3000:]
    resumed = _torchrun(_train_args(tmp_path / "part", 3, "--model.fsdp", "--resume"), timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert _metric_rows(tmp_path / "full") == _metric_rows(tmp_path / "part")

    from transformers import AutoModelForCausalLM, AutoModelForTokenClassification

    it, path = latest_checkpoint(tmp_path / "part")
    assert it == 3
    AutoModelForCausalLM.from_pretrained(path / "policy")  # full, unsharded weights
    AutoModelForTokenClassification.from_pretrained(path / "critic")
    # a different world size is refused with a clear message
    proc = subprocess.run(
        [sys.executable, "-m", "ppo_lm", *_train_args(tmp_path / "part", 4, "--resume")[2:]],
        env=dict(os.environ, PYTHONPATH=str(HERE)), capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 2 and "same world size" in proc.stderr


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["ddp", "fsdp"])
def test_lora_under_torchrun_resumes_as_uninterrupted(tmp_path, mode):
    """LoRA adapters on the policy and critic (the reference: the policy with its adapters off) under DDP
    and FSDP2: runs complete, a resumed run equals an uninterrupted one, checkpoints hold the adapters."""
    extra = ["--model.lora-r", "4"] + (["--model.fsdp"] if mode == "fsdp" else [])
    for out, iterations, more in (("full", 2, []), ("part", 1, []), ("part", 2, ["--resume"])):
        proc = _torchrun(_train_args(tmp_path / out, iterations, *extra, *more), timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
    assert _metric_rows(tmp_path / "full") == _metric_rows(tmp_path / "part")
    (_, a), (_, b) = latest_checkpoint(tmp_path / "full"), latest_checkpoint(tmp_path / "part")
    for name in ("policy/adapter_model.safetensors", "critic/adapter_model.safetensors", "critic/value_head.safetensors"):
        assert (a / name).read_bytes() == (b / name).read_bytes(), name


@pytest.mark.slow
def test_episodes_of_an_environment_under_torchrun_resume_as_uninterrupted(tmp_path):
    """Multi-turn episodes under two ranks (each runs its share of the rows' episodes, seeded per rank
    and episode): the run completes, and stopping after iteration 1 then resuming logs what the
    uninterrupted run logs."""
    env = ["--rollout.env", "builtin:equations_retry", "--rollout.max-turns", "3"]
    full = _torchrun(_train_args(tmp_path / "full", 2, *env), timeout=300)
    assert full.returncode == 0, full.stderr[-3000:]
    part = _torchrun(_train_args(tmp_path / "part", 1, *env), timeout=300)
    assert part.returncode == 0, part.stderr[-3000:]
    resumed = _torchrun(_train_args(tmp_path / "part", 2, *env, "--resume"), timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    rows = _metric_rows(tmp_path / "full")
    assert rows == _metric_rows(tmp_path / "part") and all(1 <= r["turns_mean"] <= 3 for r in rows)


@pytest.mark.slow
def test_asynchronous_ranks_each_with_a_producer_resume_as_uninterrupted(tmp_path):
    """`rollout.max_staleness` 1 under two ranks: each rank's producer process samples its share ahead
    with its rank's seeds; a run that crashes in iteration 3 (each rank's checkpoint of iteration 2
    keeping its batch sampled ahead, with version 1) and is resumed logs what the uninterrupted run logs."""
    def args(out, *more):
        a = _train_args(out, 4, "--rollout.max-staleness", "1", "--algo.off-policy-correction", "tis", *more)
        a[a.index("--model.reward") + 1] = "flaky_reward:sevens_crash_at"
        return a

    full = _torchrun(args(tmp_path / "full"), timeout=300)
    assert full.returncode == 0, full.stderr[-3000:]
    part = _torchrun(args(tmp_path / "part"), timeout=300, env_extra={"CRASH_AT": "3"})
    assert part.returncode != 0 and "injected failure at call 3" in part.stderr
    assert latest_checkpoint(tmp_path / "part")[0] == 2
    resumed = _torchrun(args(tmp_path / "part", "--resume"), timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    rows = _metric_rows(tmp_path / "full")
    assert [r["staleness_max"] for r in rows] == [0, 1, 1, 1]
    assert rows == _metric_rows(tmp_path / "part")


@pytest.mark.slow
def test_asynchronous_ranks_holding_different_counts_ahead_resume_as_uninterrupted(tmp_path):
    """Rank 1's producer is slow (its environment waits) and held-out evaluation runs between each publish
    and save, so rank 0's checkpoint holds k + 1 batches sampled ahead and rank 1's usually k (k + 1 where
    its batch was done in time: the timing is the system's). The launcher, SIGKILLed after a checkpoint,
    takes its ranks with it, and the run resumed logs what the uninterrupted run logs."""
    def args(out, *more):
        a = _train_args(out, 7, "--rollout.max-staleness", "1", "--algo.off-policy-correction", "tis",
                        "--rollout.env", "slow_env:SlowOnRank1", "--rollout.max-turns", "1", "--rollout.env-workers", "1",
                        "--data.eval-prompts", "builtin:equations", "--data.builtin-eval-prompts", "8",
                        "--log.eval-every", "1", *more)
        i = a.index("--model.reward")
        return a[:i] + a[i + 2:]  # the environment's rewards replace it

    full = _torchrun(args(tmp_path / "full"), timeout=300)
    assert full.returncode == 0, full.stderr[-3000:]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(HERE))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
           "--master-port", str(_free_port()), *args(tmp_path / "part")]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 240
    while (latest_checkpoint(tmp_path / "part") or (0,))[0] < 4 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    os.killpg(proc.pid, signal.SIGKILL)  # the launcher: its ranks run in sessions of their own
    proc.wait()
    from ppo_lm.runtime.files import OutputDirBusy, OutputDirLock

    deadline = time.monotonic() + 5  # the ranks die with their launcher, so rank 0's lock goes at once
    while True:
        try:
            OutputDirLock(tmp_path / "part").acquire().release()
            break
        except OutputDirBusy:
            assert time.monotonic() < deadline, "a rank outlived its killed launcher"
            time.sleep(0.05)
    at, path = latest_checkpoint(tmp_path / "part")
    assert 4 <= at < 7
    pending = torch.load(path / "trainer_state.pt", weights_only=False)["pending"]
    counts = [len(p) for p in pending]  # usually [2, 1]; [2, 2] where rank 1's batch was done before the save
    assert set(counts) <= {1, 2} and counts[0] == 2, [[b["iteration"] for b in p] for p in pending]
    resumed = _torchrun(args(tmp_path / "part", "--resume"), timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert _metric_rows(tmp_path / "part") == _metric_rows(tmp_path / "full")
