"""Asynchronous PPO (rollout/sources/async_source.py, docs/async.md): iteration j is sampled with the weights
of iteration j − 1 − k exactly, however the producer thread and the learner are timed; a resumed run
equals the uninterrupted one (the checkpoint keeps the batches sampled ahead); a producer's error
stops the run where the learner takes the batch; settings that cannot work are refused."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from trainer_helpers import count_sevens, tiny_config

from ppo_lm.runtime.errors import ConfigError
from ppo_lm.trainer.checkpoint.folders import list_checkpoints
from ppo_lm.trainer.ppo import PPOTrainer

KW = dict(rollout__max_staleness=2, algo__off_policy_correction="tis", rollout__num_prompts=8,
          rollout__max_new_tokens=6, critic__warmup_iterations=0, log__save_every=1)


def _metrics(out) -> list[dict]:
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.endswith(("_s", "_per_s"))} for r in rows]


def test_each_iteration_samples_with_the_weights_k_updates_old(tmp_path):
    tr = PPOTrainer(tiny_config(tmp_path, iterations=5, **KW), verifier=count_sevens)
    taken = []
    score = tr.score
    tr.score = lambda trajectories: taken.append(trajectories) or score(trajectories)
    history = tr.train()
    assert [t.iteration for t in taken] == [1, 2, 3, 4, 5]
    assert [{x.version for x in t.trajectories} for t in taken] == [{0}, {0}, {0}, {1}, {2}]
    assert [m["staleness_max"] for m in history] == [0, 1, 2, 2, 2]
    assert history[-1]["is_weight_max"] != 1  # the weights moved: the sampler's and the learner's differ
    assert all(m["learner_wait_s"] >= 0 and m["producer_wait_s"] >= 0 for m in history)
    assert tr.sampler.engine.version == 5  # the learner's own engine (held-out evaluation) is published to too


@pytest.mark.slow  # ~4-12 s of producer processes; .ci/run runs it
def test_a_run_resumed_after_a_crash_equals_the_uninterrupted_one(tmp_path, monkeypatch):
    import ppo_lm.trainer.ppo as ppo

    whole = PPOTrainer(tiny_config(tmp_path / "whole", iterations=4, **KW), verifier=count_sevens)
    whole.train()
    save = ppo.save_checkpoint

    def crash_after_two(run, out, iteration, keep):
        save(run, out, iteration, keep)
        if iteration == 2:
            raise KeyboardInterrupt

    monkeypatch.setattr(ppo, "save_checkpoint", crash_after_two)
    with pytest.raises(KeyboardInterrupt):
        PPOTrainer(tiny_config(tmp_path / "cut", iterations=4, **KW), verifier=count_sevens).train()
    monkeypatch.setattr(ppo, "save_checkpoint", save)
    saved = torch.load(list_checkpoints(tmp_path / "cut")[-1][1] / "trainer_state.pt", weights_only=False)
    assert [b["iteration"] for b in saved["pending"][0]] == [3, 4]  # sampled ahead, with versions 0 and 1
    assert [{t["version"] for t in b["trajectories"]} for b in saved["pending"][0]] == [{0}, {1}]
    resumed = PPOTrainer(tiny_config(tmp_path / "cut", iterations=4, resume=True, **KW), verifier=count_sevens)
    resumed.train()
    assert _metrics(tmp_path / "cut") == _metrics(tmp_path / "whole")
    for a, b in zip(whole.models.policy.state_dict().values(), resumed.models.policy.state_dict().values()):
        assert torch.equal(a, b)


@pytest.mark.slow  # ~8 s of producer processes; .ci/run runs it
def test_a_finished_run_continued_samples_its_first_new_iterations_with_its_last_weights(tmp_path):
    PPOTrainer(tiny_config(tmp_path, iterations=2, **KW), verifier=count_sevens).train()
    more = PPOTrainer(tiny_config(tmp_path, iterations=5, resume=True, **KW), verifier=count_sevens)
    history = more.train()
    assert [m["staleness_max"] for m in history] == [0, 1, 2]  # all three sampled with version 2, the checkpoint's


class FailsAt:
    """A plan whose iteration ``at`` fails in the producer's process: ``kill`` it there by SIGKILL (as
    the system's out-of-memory killer would), else raise."""

    def __init__(self, plan, at: int, kill: bool = False):
        self.plan, self.at, self.kill = plan, at, kill

    def __call__(self, iteration: int):
        if iteration == self.at:
            if self.kill:
                os.kill(os.getpid(), signal.SIGKILL)
            raise RuntimeError("the sandbox went away")
        return self.plan(iteration)


def _producers() -> list[int]:
    """Live producer processes started by this one."""
    found = []
    for proc in Path("/proc").iterdir():
        with contextlib.suppress(OSError):
            stat = (proc / "stat").read_text()
            if proc.name.isdigit() and "producer_process" in (proc / "cmdline").read_text(errors="replace") \
                    and stat.rsplit(")", 1)[1].split()[:2][1] == str(os.getpid()) and " Z " not in stat:
                found.append(int(proc.name))
    return found


def test_a_producer_error_stops_the_run_where_the_learner_takes(tmp_path):
    from ppo_lm.rollout.sources.async_source import ProducerError

    tr = PPOTrainer(tiny_config(tmp_path, iterations=3, **KW), verifier=count_sevens)
    tr.source.plan = FailsAt(tr.source.plan, 2)
    with pytest.raises(ProducerError, match="RuntimeError: the sandbox went away") as caught:
        tr.train()
    assert "test_async.py" in str(caught.value.__cause__)  # the producer's own traceback, to the raise
    assert tr.source._proc is None and not _producers()  # closed: no process left behind


@pytest.mark.slow  # ~8 s of producer processes; .ci/run runs it
def test_a_killed_producer_stops_the_run_in_one_line_with_its_checkpoints_intact(tmp_path):
    from ppo_lm.runtime.errors import UserError

    tr = PPOTrainer(tiny_config(tmp_path, iterations=5, **KW), verifier=count_sevens)
    tr.source.plan = FailsAt(tr.source.plan, 4, kill=True)
    with pytest.raises(UserError, match=r"producer's process ended \(signal SIGKILL\)"):
        tr.train()
    assert not _producers()
    assert [i for i, _ in list_checkpoints(tmp_path)] == [1]  # iteration 2 waited on batch 4 to save
    PPOTrainer(tiny_config(tmp_path, iterations=5, resume=True, **KW), verifier=count_sevens).train()
    assert [json.loads(x)["iteration"] for x in (tmp_path / "metrics.jsonl").read_text().splitlines()] == [1, 2, 3, 4, 5]


@pytest.mark.slow  # ~8 s of producer processes; .ci/run runs it
def test_the_producer_does_not_outlive_a_killed_learner(tmp_path):
    script = tmp_path / "learner.py"
    script.write_text(textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from trainer_helpers import count_sevens, tiny_config
        from ppo_lm.trainer.ppo import PPOTrainer
        tr = PPOTrainer(tiny_config({str(tmp_path / "run")!r}, iterations=3, **{KW!r}), verifier=count_sevens)
        tr.source.start(0)
        print("producer", tr.source._proc.pid, flush=True)
        time.sleep(600)
    """))
    learner = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    producer = int(next(line for line in learner.stdout if line.startswith("producer ")).split()[1])
    assert _alive(producer)
    learner.kill()
    learner.wait()
    deadline = time.monotonic() + 20
    while _alive(producer) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(producer)


def _alive(pid: int) -> bool:
    try:
        return " Z " not in Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False


@pytest.mark.slow  # ~4-12 s of producer processes; .ci/run runs it
def test_lora_publishes_the_adapters_only(tmp_path):
    tr = PPOTrainer(tiny_config(tmp_path, iterations=3, model__lora_r=4, **KW), verifier=count_sevens)
    history = tr.train()
    names = tr.source.layout.names
    assert names and all("lora_" in n for n in names)
    assert [m["staleness_max"] for m in history] == [0, 1, 2] and history[-1]["is_weight_max"] != 1


@pytest.mark.parametrize("extra, match", [
    ({"algo__off_policy_correction": None}, "choose how the policy loss corrects"),
    ({"rollout__logp_from_sampler": True, "algo__off_policy_correction": "tis"}, "logp_old must be the learner's"),
    ({"model__fsdp": True}, "a sharded run does not hold"),
])
def test_settings_that_cannot_work_are_refused(tmp_path, extra, match):
    with pytest.raises(ConfigError, match=match):
        PPOTrainer(tiny_config(tmp_path, **{**KW, **extra}), verifier=count_sevens)


@pytest.mark.slow  # ~4-12 s of producer processes; .ci/run runs it
def test_an_environments_episodes_are_sampled_ahead_too(tmp_path):
    cfg = tiny_config(tmp_path, iterations=3, rollout__env="builtin:equations_retry", rollout__max_turns=2,
                      rollout__samples_per_prompt=2, **KW)
    tr = PPOTrainer(cfg)
    assert tr.source.producer.envs is not tr.sampler.producer.envs  # the producer's own workers
    history = tr.train()
    assert [m["staleness_max"] for m in history] == [0, 1, 2] and all(m["turns_mean"] >= 1 for m in history)


def test_the_weight_box_hands_every_dtype_and_shape_over_to_another_process(tmp_path):
    from ppo_lm.rollout.sources.weight_box import WeightBox

    g = torch.Generator().manual_seed(0)
    params = [("a", torch.randn(3, 5, generator=g)), ("b", torch.randn(7, generator=g).to(torch.bfloat16)),
              ("c", torch.randn(2, 2, 2, generator=g).double()), ("d", torch.randn((), generator=g))]
    box = WeightBox.create(params)
    out = tmp_path / "read.pt"
    code = textwrap.dedent(f"""
        import pickle, sys, torch
        from ppo_lm.rollout.sources.weight_box import WeightBox
        layout = pickle.loads(bytes.fromhex(sys.argv[1]))
        box = WeightBox.attach({box.fd}, layout)  # the descriptor, inherited: the box has no name
        box.close_fd()
        torch.save([v.clone() for v in box.views], {str(out)!r})
    """)
    import pickle

    subprocess.run([sys.executable, "-c", code, pickle.dumps(box.layout).hex()], check=True, pass_fds=(box.fd,))
    box.close_fd()
    for (_, want), got in zip(params, torch.load(out)):
        assert got.dtype == want.dtype and torch.equal(got, want)
    later = [p.clone() * 2 for _, p in params]
    box.write(later)  # still mapped here with the descriptor closed
    mine = [torch.zeros_like(p) for p in later]
    box.read_into(mine)
    assert all(torch.equal(a, b) for a, b in zip(mine, later))


def test_an_environments_error_in_the_producer_is_its_own_line(tmp_path, capsys):
    from ppo_lm.cli.main import main

    env = tmp_path / "bad_env.py"
    env.write_text(textwrap.dedent("""
        class Bad:
            def reset(self, row, seed):
                return row["prompt"]

            def step(self, text):
                raise ValueError("the sandbox is gone")
    """))
    code = main(["train", "--iterations", "2", "--log.no-tensorboard", "--rollout.num-prompts", "4",
                 "--rollout.env", f"{env}:Bad", "--rollout.env-workers", "1", "--rollout.max-staleness", "1",
                 "--algo.off-policy-correction", "tis", "--output-dir", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert code == 2 and "raised ValueError: the sandbox is gone" in err and "Traceback" not in err, err
    assert not _producers()


@pytest.mark.slow  # ~4-12 s of producer processes; .ci/run runs it
def test_group_estimators_and_held_out_evaluation_run_ahead_too(tmp_path):
    """GRPO's groups stay whole when sampled ahead (a group's samples share their prompt); held-out
    evaluation runs on the learner's side."""
    kw = dict(KW, algo__estimator="grpo", rollout__samples_per_prompt=2, data__eval_prompts="builtin:equations",
              data__builtin_eval_prompts=8, iterations=3)
    tr = PPOTrainer(tiny_config(tmp_path, **kw), verifier=count_sevens)
    taken = []
    score = tr.score
    tr.score = lambda trajectories: taken.append(trajectories) or score(trajectories)
    history = tr.train()
    assert [m["staleness_max"] for m in history] == [0, 1, 2] and "eval_score" in history[-1]
    for batch in taken:
        t = batch.trajectories
        assert batch.group_size == 2 and len(t) == 8 * 2
        assert all(a.row == b.row and a.prompt_ids == b.prompt_ids for a, b in zip(t[::2], t[1::2]))


def test_every_token_is_sampled_by_the_weights_its_version_names(tmp_path):
    """The producer's log-probabilities of what it sampled are those of the learner's weights of the
    version each trajectory carries (kept at each publish), recomputed here by a plain forward."""
    import copy

    tr = PPOTrainer(tiny_config(tmp_path, iterations=5, **KW), verifier=count_sevens)
    versions = {0: copy.deepcopy(tr.models.policy.lm.state_dict())}
    publish = tr.source.publish
    tr.source.publish = lambda v: versions.__setitem__(v, copy.deepcopy(tr.models.policy.lm.state_dict())) or publish(v)
    taken = []
    score = tr.score
    tr.score = lambda trajectories: taken.append(trajectories) or score(trajectories)
    tr.train()
    lm = copy.deepcopy(tr.models.policy.lm).eval()

    def logprobs(t, version):
        lm.load_state_dict(versions[version])
        with torch.no_grad():
            logp = torch.log_softmax(lm(torch.tensor([t.prompt_ids + t.tokens])).logits[0, len(t.prompt_ids) - 1: -1], -1)
        return logp.gather(1, torch.tensor(t.tokens).unsqueeze(1)).squeeze(1)

    checked, off = set(), 0.0
    for batch in taken:
        for t in batch.trajectories[:3]:
            assert torch.allclose(logprobs(t, t.version), torch.tensor(t.logprobs), atol=2e-4), (batch.iteration, t.version)
            off = max(off, float((logprobs(t, t.version + 1) - torch.tensor(t.logprobs)).abs().max()))
            checked.add(t.version)
    assert checked == {0, 1, 2} and off > 1e-2  # the next version's would not have matched
