"""Checkpoints you can trust: a manifest written last, resume that falls back past a damaged
checkpoint, nothing unpickled but tensors and plain values, and resume that says what it does."""

from __future__ import annotations

import json

import pytest
import torch
from trainer_helpers import count_sevens, tiny_config

from ppo_lm.cli import main
from ppo_lm.trainer.checkpoint import MANIFEST, list_checkpoints, verify, write_manifest
from ppo_lm.trainer.ppo import PPOTrainer

TINY = ["--model.builtin-hidden-size", "32", "--rollout.num-prompts", "8", "--rollout.max-new-tokens", "4",
        "--optim.epochs", "1", "--data.builtin-num-prompts", "64", "--log.save-every", "1", "--log.no-progress",
        "--log.no-tensorboard", "--threads", "1"]


def _iterations(run):
    return [json.loads(x)["iteration"] for x in (run / "metrics.jsonl").read_text().splitlines()]


def _two_checkpoints(tmp_path):
    run = tmp_path / "run"
    assert main(["train", "--output-dir", str(run), "--iterations", "2", *TINY]) == 0
    found = list_checkpoints(run)
    assert [i for i, _ in found] == [1, 2]
    return run, found


def test_manifest_lists_every_file_and_catches_damage(tmp_path):
    PPOTrainer(tiny_config(tmp_path, iterations=1, log__save_every=1), verifier=count_sevens).train()
    (_, path), = list_checkpoints(tmp_path)
    listed = json.loads((path / MANIFEST).read_text())["files"]
    assert {"trainer_state.pt", "policy/model.safetensors", "critic/model.safetensors"} <= set(listed)
    assert verify(path) is None
    weights = path / "policy" / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2])  # a truncated copy
    assert "policy/model.safetensors has" in verify(path)
    weights.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))  # same size, one bit flipped
    assert "checksum" in verify(path)
    (path / MANIFEST).unlink()
    assert "no manifest" in verify(path)


@pytest.mark.parametrize("damage", ["truncated_state", "truncated_weights"])
def test_resume_falls_back_to_the_newest_intact_checkpoint(tmp_path, capsys, damage):
    run, found = _two_checkpoints(tmp_path)
    newest = found[-1][1]
    target = newest / ("trainer_state.pt" if damage == "truncated_state" else "policy/model.safetensors")
    target.write_bytes(target.read_bytes()[:100])
    with pytest.warns(UserWarning, match="iter_000002 is damaged"):
        assert main(["train", "--output-dir", str(run), "--iterations", "3", "--resume"]) == 0
    assert _iterations(run) == [1, 2, 3]  # iteration 2 was redone from checkpoint 1


def test_every_checkpoint_damaged_is_a_one_line_error(tmp_path, capsys):
    run, found = _two_checkpoints(tmp_path)
    for _, path in found:
        (path / "trainer_state.pt").write_bytes(b"\0" * 10)
    capsys.readouterr()
    with pytest.warns(UserWarning):
        assert main(["train", "--output-dir", str(run), "--iterations", "3", "--resume"]) == 2
    err = capsys.readouterr().err
    assert "no intact checkpoint" in err and "Traceback" not in err


class _Exploit:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):  # what a malicious checkpoint would run on unpickling
        return (open, (str(self.marker), "w"))


def test_a_malicious_pickle_in_a_checkpoint_is_not_run(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", "--output-dir", str(run), "--iterations", "1", *TINY]) == 0
    (_, path), = list_checkpoints(run)
    marker = tmp_path / "pwned"
    torch.save({"state": _Exploit(marker)}, path / "trainer_state.pt")
    write_manifest(path)  # the manifest agrees: only the loader stands between the file and the code
    capsys.readouterr()
    with pytest.warns(UserWarning, match="does not unpickle"):
        assert main(["train", "--output-dir", str(run), "--iterations", "2", "--resume"]) == 2
    assert not marker.exists()
    err = capsys.readouterr().err
    assert "does not unpickle" in err and "Traceback" not in err


def test_resume_without_a_checkpoint_is_an_error_and_auto_resume_starts_fresh(tmp_path, capsys):
    run = str(tmp_path / "run")
    assert main(["train", "--output-dir", run, "--iterations", "1", "--resume", *TINY]) == 2
    assert "holds no checkpoint" in capsys.readouterr().err
    assert not (tmp_path / "run" / "metrics.jsonl").exists()
    assert main(["train", "--output-dir", run, "--iterations", "1", "--auto-resume", *TINY]) == 0
    assert _iterations(tmp_path / "run") == [1]
    # the same command after a restart continues the run, with its own settings
    assert main(["train", "--output-dir", run, "--iterations", "2", "--auto-resume"]) == 0
    assert _iterations(tmp_path / "run") == [1, 2]


def test_resume_of_a_finished_run_changes_nothing(tmp_path, capsys):
    run, _ = _two_checkpoints(tmp_path)
    before = {p: p.read_bytes() for p in (run / "config.yaml", run / "metrics.jsonl")}
    capsys.readouterr()
    assert main(["train", "--output-dir", str(run), "--iterations", "1", "--resume"]) == 0
    assert "at iteration 2, which already reaches --iterations 1; nothing to do" in capsys.readouterr().out
    assert {p: p.read_bytes() for p in before} == before
    assert [i for i, _ in list_checkpoints(run)] == [1, 2]


def test_small_cli_mistakes_are_one_line_errors(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["train", "--config", str(tmp_path), "--output-dir", str(tmp_path / "r")])
    assert exit_.value.code == 2
    assert "is a directory; pass the YAML file itself" in capsys.readouterr().err
    assert main(["train", "--output-dir", str(tmp_path / "r"), "--rollout.temperature", "inf", *TINY]) == 2
    assert "`rollout.temperature` must be finite" in capsys.readouterr().err
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.startswith("ppo-lm ")


@pytest.mark.parametrize("where", ["file", "under_file"])
def test_an_output_dir_that_cannot_be_one_fails_before_any_model_loads(tmp_path, capsys, monkeypatch, where):
    from ppo_lm.trainer import builders

    def no_models(*a, **k):
        raise AssertionError("a model was built before the output directory was checked")

    monkeypatch.setattr(builders, "build_policy", no_models)
    blocker = tmp_path / "taken"
    blocker.write_text("a user's file")
    out = blocker if where == "file" else blocker / "run"
    assert main(["train", "--output-dir", str(out), *TINY]) == 2
    err = capsys.readouterr().err
    assert ("is a file, not a directory" if where == "file" else "which is a file") in err
    assert blocker.read_text() == "a user's file"
