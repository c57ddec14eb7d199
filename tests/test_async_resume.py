"""Asynchronous resume at any moment (docs/async.md, "Resume and failure"): after publishing version
i the producer may already have sampled iteration i + k + 1 (it needs only version i), so a
checkpoint keeps k or k + 1 batches sampled ahead — more when held-out evaluation or sample logging
runs between the publish and the save. Whichever it kept, the resumed run takes exactly what the
uninterrupted one took and ends with the same weights, for k = 1, 2 and 4. A side that waits on the
other with no word from it for `rollout.stall_timeout_s` ends the run with one line naming what it
waited for and where the checkpoints are."""

from __future__ import annotations

import json
import time

import pytest
import torch
from trainer_helpers import count_sevens, tiny_config

from ppo_lm.trainer.checkpoint.folders import list_checkpoints
from ppo_lm.trainer.ppo import PPOTrainer

ITERATIONS = 7


def _kw(k: int) -> dict:
    return dict(rollout__max_staleness=k, algo__off_policy_correction="tis", rollout__num_prompts=8,
                rollout__max_new_tokens=6, critic__warmup_iterations=0, log__save_every=1,
                iterations=ITERATIONS)


def _metrics(out) -> list[dict]:
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.endswith(("_s", "_per_s"))} for r in rows]


def _cut(tmp_path, monkeypatch, k: int, at: int, ahead: int):
    """A run that saves iteration ``at`` holding ``ahead`` batches sampled ahead (k or k + 1), then crashes."""
    import ppo_lm.trainer.ppo as ppo

    save = ppo.save_checkpoint
    trainer = PPOTrainer(tiny_config(tmp_path / "cut", **_kw(k)), verifier=count_sevens)

    def save_then_crash(run, out, iteration, keep):
        if iteration == at:
            # as a slow evaluation between the publish and the save would: the producer samples i + k + 1 first
            deadline = time.monotonic() + 60
            while ahead > k and at + k + 1 not in trainer.source._ready and time.monotonic() < deadline:
                time.sleep(0.01)
        save(run, out, iteration, keep)
        if iteration == at:
            raise KeyboardInterrupt

    monkeypatch.setattr(ppo, "save_checkpoint", save_then_crash)
    with pytest.raises(KeyboardInterrupt):
        trainer.train()
    monkeypatch.setattr(ppo, "save_checkpoint", save)
    saved = torch.load(list_checkpoints(tmp_path / "cut")[-1][1] / "trainer_state.pt", weights_only=False)
    return [b["iteration"] for b in saved["pending"][0]]


@pytest.mark.slow  # ~17 s for k = 1, ~50 s each for 2 and 4: .ci/run runs them
@pytest.mark.parametrize("k", [1, 2, 4])
def test_a_checkpoint_with_k_plus_one_batches_ahead_resumes_equal_to_the_uninterrupted_run(tmp_path, monkeypatch, k):
    whole = PPOTrainer(tiny_config(tmp_path / "whole", **_kw(k)), verifier=count_sevens)
    whole.train()
    at = 2
    kept = _cut(tmp_path, monkeypatch, k, at, ahead=k + 1)
    assert kept == list(range(at + 1, at + k + 2))  # k + 1 batches: the last sampled with version `at`
    resumed = PPOTrainer(tiny_config(tmp_path / "cut", resume=True, **_kw(k)), verifier=count_sevens)
    resumed.source.stall_timeout_s = 60.0  # a hang fails the test in a minute rather than never ending
    resumed.train()
    assert _metrics(tmp_path / "cut") == _metrics(tmp_path / "whole")
    for a, b in zip(whole.models.policy.state_dict().values(), resumed.models.policy.state_dict().values()):
        assert torch.equal(a, b)


class SleepsAt:
    """A plan whose iteration ``at`` hangs in the producer's process (an environment stuck)."""

    def __init__(self, plan, at: int):
        self.plan, self.at = plan, at

    def __call__(self, iteration: int):
        if iteration == self.at:
            time.sleep(600)
        return self.plan(iteration)


@pytest.mark.slow  # ~10 s: .ci/run runs it
def test_a_producer_that_stalls_ends_the_run_with_one_line(tmp_path):
    from ppo_lm.rollout.sources.async_source import ProducerStalled

    tr = PPOTrainer(tiny_config(tmp_path, **_kw(1)), verifier=count_sevens)
    tr.source.plan, tr.source.stall_timeout_s = SleepsAt(tr.source.plan, 3), 5.0
    t0 = time.monotonic()
    with pytest.raises(ProducerStalled) as caught:
        tr.train()
    line = str(caught.value)
    assert "waited 5 s for the batch of iteration 3" in line and str(tmp_path.resolve()) in line, line
    assert "\n" not in line and time.monotonic() - t0 < 60
    assert [it for it, _ in list_checkpoints(tmp_path)] == [1]  # saving 2 waited for batch 3, to keep it
    assert tr.source._proc is None  # the producer's process ended with the run


@pytest.mark.slow  # ~12 s: .ci/run runs it
def test_a_learner_that_stalls_ends_the_producer_with_one_line(tmp_path, monkeypatch):
    from ppo_lm.rollout.sources.producer_process import ProducerWaitedTooLong

    tr = PPOTrainer(tiny_config(tmp_path, **_kw(1)), verifier=count_sevens)
    tr.source.stall_timeout_s = 5.0
    learn = tr.learn

    def slow_learn(batch, iteration, timer=None):  # the learner stuck before publishing version 1
        if iteration == 1:
            time.sleep(8)
        return learn(batch, iteration, timer)

    monkeypatch.setattr(tr, "learn", slow_learn)
    with pytest.raises(ProducerWaitedTooLong, match="waited 5 s for the learner's weights of version 1"):
        tr.train()


def test_the_weight_box_leaves_no_file_and_a_box_too_large_fails_in_one_line(tmp_path, monkeypatch):
    """The box has no name to leave behind (anonymous memory, or a file removed as it is opened), and its
    whole size is reserved before the first write: too little room is one line naming the fix."""
    import errno
    import os

    from ppo_lm.rollout.sources.weight_box import BoxTooLarge, WeightBox

    params = [("w", torch.randn(300, 40)), ("b", torch.randn(7))]
    for folder in (None, str(tmp_path)):
        box = WeightBox.create(params, folder)
        assert not list(tmp_path.iterdir())
        out = [torch.empty(300, 40), torch.empty(7)]
        box.read_into(out)
        assert all(torch.equal(a, p) for a, (_, p) in zip(out, params))
        box.close_fd()

    class Full:
        f_bavail, f_frsize = 10, 4096  # 40 kB free

    monkeypatch.setattr(os, "statvfs", lambda path: Full())
    with pytest.raises(BoxTooLarge, match=r"needs 0 MB and .* has 0 MB free: give the container more shared "
                                          r"memory \(`docker run --shm-size=...`\), or set `rollout.weight_box_dir`"):
        WeightBox.create(params, str(tmp_path))
    monkeypatch.undo()

    def no_room(fd, offset, size):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "posix_fallocate", no_room)
    with pytest.raises(BoxTooLarge, match="memory could not hold it .* set `rollout.weight_box_dir` to a folder on disk"):
        WeightBox.create(params)
    assert not list(tmp_path.iterdir())


def test_a_run_with_a_file_backed_box_trains_and_leaves_the_folder_empty(tmp_path):
    box = tmp_path / "box"
    box.mkdir()
    history = PPOTrainer(tiny_config(tmp_path / "run", rollout__weight_box_dir=str(box), **dict(_kw(1), iterations=3)),
                         verifier=count_sevens).train()
    assert len(history) == 3 and history[-1]["staleness_max"] == 1
    assert not list(box.iterdir())


@pytest.mark.parametrize("k", [1, 2, 4])
def test_the_staleness_rule_against_its_definition(k):
    """Staleness answers what the schedule of docs/async.md defines, from a fresh start and a resumed one:
    s(j) = max(floor, j − 1 − k); a version is written while some iteration up to the last samples with it;
    after publishing v a checkpoint holds v + 1 … v + k (not past the last), and the iteration after them
    samples with v."""
    from ppo_lm.rollout.sources.staleness import Staleness

    for floor in (0, 3):
        lag = Staleness(k, floor, last=12)
        for j in range(floor + 1, 13):
            assert lag.version_for(j) == max(floor, j - 1 - k)
            assert j - 1 - lag.version_for(j) <= k  # never more than k updates behind
        used = {lag.version_for(j) for j in range(floor + 1, 13)}
        assert [v for v in range(floor, 13) if lag.needed(v)] == sorted(used)
        for v in range(floor, 12):
            held = list(lag.ahead(v))
            assert held == list(range(v + 1, min(v + k, 12) + 1))
            assert all(lag.version_for(j) <= v for j in held)
            assert lag.version_for(held[-1] + 1) <= v  # the resumed producer starts with what it holds
            assert held[-1] == 12 or lag.version_for(held[-1] + 2) == v + 1  # holding fewer would not do
