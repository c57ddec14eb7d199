"""Checkpoints you can trust: a manifest written last, resume that falls back past a damaged
checkpoint, nothing unpickled but tensors and plain values, and resume that says what it does."""

from __future__ import annotations

import errno
import json
import os
import shutil

import pytest
import torch
from trainer_helpers import count_sevens, tiny_config

from ppo_lm.cli.main import main
from ppo_lm.trainer.checkpoint import folders as ckpt
from ppo_lm.trainer.checkpoint.folders import MANIFEST, list_checkpoints, prune, verify, write_manifest
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


def test_every_checkpoint_damaged_is_a_one_line_error(tmp_path, capsys, monkeypatch):
    """Truncated files are found from the manifest's sizes before any model loads; a changed byte
    (same size) by the checksums when resume reads the checkpoint."""
    from ppo_lm.trainer import roles

    run, found = _two_checkpoints(tmp_path)
    originals = {path: (path / "trainer_state.pt").read_bytes() for _, path in found}
    for path in originals:
        (path / "trainer_state.pt").write_bytes(b"\0" * 10)
    capsys.readouterr()
    with monkeypatch.context() as m:
        m.setattr(roles, "build_policy", lambda *a, **k: pytest.fail("a model was built"))
        assert main(["train", "--output-dir", str(run), "--iterations", "3", "--resume"]) == 2
    err = capsys.readouterr().err
    assert "no intact checkpoint" in err and "trainer_state.pt has 10 bytes, the manifest says" in err
    assert "Traceback" not in err
    for path, data in originals.items():  # same sizes, one byte changed
        (path / "trainer_state.pt").write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    with pytest.warns(UserWarning):
        assert main(["train", "--output-dir", str(run), "--iterations", "3", "--resume"]) == 2
    err = capsys.readouterr().err
    assert "no intact checkpoint" in err and "does not match its checksum" in err and "Traceback" not in err


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
    assert "`rollout.temperature` must be a finite number > 0, got inf" in capsys.readouterr().err
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.startswith("ppo-lm ")


@pytest.mark.parametrize("where", ["file", "under_file"])
def test_an_output_dir_that_cannot_be_one_fails_before_any_model_loads(tmp_path, capsys, monkeypatch, where):
    from ppo_lm.trainer import roles

    def no_models(*a, **k):
        raise AssertionError("a model was built before the output directory was checked")

    monkeypatch.setattr(roles, "build_policy", no_models)
    blocker = tmp_path / "taken"
    blocker.write_text("a user's file")
    out = blocker if where == "file" else blocker / "run"
    assert main(["train", "--output-dir", str(out), *TINY]) == 2
    err = capsys.readouterr().err
    assert ("is a file, not a directory" if where == "file" else "which is a file") in err
    assert blocker.read_text() == "a user's file"


_ENOSPC = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def _fill_disk_at(monkeypatch, where):
    """Make the write of one part of a checkpoint fail as on a full disk, after writing a few bytes."""
    if where == "weights":  # transformers writes with safetensors, whose error names the OS error
        import transformers.modeling_utils
        from safetensors import SafetensorError

        def no_space(tensors, filename, metadata=None):
            with open(filename, "wb") as fh:
                fh.write(b"\0" * 100)
            raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

        monkeypatch.setattr(transformers.modeling_utils, "safe_save_file", no_space)
    elif where == "trainer_state":

        def no_space(obj, fh, *a, **k):
            fh.write(b"PK" * 100)
            raise _ENOSPC

        monkeypatch.setattr(torch, "save", no_space)
    else:

        def no_space(directory):
            (directory / MANIFEST).write_text('{"files": {')
            raise _ENOSPC

        monkeypatch.setattr(ckpt, "write_manifest", no_space)


@pytest.mark.parametrize("where", ["weights", "trainer_state", "manifest"])
def test_a_full_disk_during_a_save_keeps_the_previous_checkpoint_and_stops_with_one_line(
        tmp_path, capsys, monkeypatch, where):
    run = tmp_path / "run"
    # keep_last 1: the previous checkpoint would be the one pruned, were pruning done before the new one is complete
    assert main(["train", "--output-dir", str(run), "--iterations", "1", *TINY, "--log.keep-last", "1"]) == 0
    _fill_disk_at(monkeypatch, where)
    capsys.readouterr()
    assert main(["train", "--output-dir", str(run), "--iterations", "2", "--resume"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"ppo-lm: error: could not write checkpoint 2 to {str(run / 'checkpoints')!r}: No space left on device; "
        "the previous checkpoint (iteration 1) is intact; free space and resume with --resume"]
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["iter_000001"]  # no half-written .tmp-*
    assert verify(run / "checkpoints" / "iter_000001") is None
    monkeypatch.undo()  # space freed: the resume the message names continues from checkpoint 1
    assert main(["train", "--output-dir", str(run), "--iterations", "2", "--resume"]) == 0
    assert _iterations(run) == [1, 2]
    assert [i for i, _ in list_checkpoints(run)] == [2]


def test_a_full_disk_at_the_first_save_says_there_is_no_checkpoint(tmp_path, capsys, monkeypatch):
    run = tmp_path / "run"
    _fill_disk_at(monkeypatch, "trainer_state")
    assert main(["train", "--output-dir", str(run), "--iterations", "1", *TINY]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"ppo-lm: error: could not write checkpoint 1 to {str(run / 'checkpoints')!r}: No space left on device; "
        "there is no earlier intact checkpoint; free space and start the run again in a new --output-dir"]
    assert list((run / "checkpoints").iterdir()) == []


def test_a_bug_while_saving_keeps_its_traceback(tmp_path, monkeypatch):
    """Only failed writes become the one-line error; anything else is a bug and is not disguised."""
    PPOTrainer(tiny_config(tmp_path, iterations=1, log__save_every=1), verifier=count_sevens).train()

    def bug(*a, **k):
        raise RuntimeError("not an I/O error")

    monkeypatch.setattr(torch, "save", bug)
    with pytest.raises(RuntimeError, match="not an I/O error"):
        PPOTrainer(tiny_config(tmp_path, iterations=2, resume=True, log__save_every=1),
                   verifier=count_sevens).train()
    assert not list((tmp_path / "checkpoints").glob(".tmp-*"))


def _fake_checkpoints(tmp_path, iterations):
    for i in iterations:
        (ckpt.checkpoint_dir(tmp_path) / f"iter_{i:06d}").mkdir(parents=True)
        (ckpt.checkpoint_dir(tmp_path) / f"iter_{i:06d}" / "trainer_state.pt").write_bytes(b"")


@pytest.mark.parametrize("keep_last,left", [(1, [3, 4, 5]), (2, [2, 3, 4, 5]), (5, [1, 2, 3, 4, 5])])
def test_prune_keeps_the_new_checkpoint_and_never_touches_newer_ones(tmp_path, keep_last, left):
    _fake_checkpoints(tmp_path, [1, 2, 3, 4, 5])
    prune(tmp_path, 3, keep_last)  # 3 just written; 4 and 5 are left from an attempt resume fell back from
    assert [i for i, _ in list_checkpoints(tmp_path)] == left
    assert sorted(p.name for p in ckpt.checkpoint_dir(tmp_path).iterdir()) == [f"iter_{i:06d}" for i in left]


def test_pruning_never_deletes_the_newest_intact_checkpoint(tmp_path, capsys):
    """keep_last 1 with a damaged newer checkpoint: the run resumes from the intact one and saves the
    next; pruning "all but the newest one" by name would delete both and keep only the damaged one."""
    run = tmp_path / "run"
    assert main(["train", "--output-dir", str(run), "--iterations", "3", *TINY, "--log.keep-last", "3"]) == 0
    shutil.rmtree(run / "checkpoints" / "iter_000002")
    damaged = run / "checkpoints" / "iter_000003" / "trainer_state.pt"
    damaged.write_bytes(damaged.read_bytes()[:100])
    with pytest.warns(UserWarning, match="iter_000003 is damaged"):
        assert main(["train", "--output-dir", str(run), "--iterations", "2", "--resume", "--log.keep-last", "1"]) == 0
    assert [i for i, _ in list_checkpoints(run)] == [2, 3]
    assert verify(run / "checkpoints" / "iter_000002") is None
    with pytest.warns(UserWarning, match="iter_000003 is damaged"):  # a later resume starts from 2
        assert main(["train", "--output-dir", str(run), "--iterations", "3", "--resume"]) == 0
    assert _iterations(run) == [1, 2, 3]
    assert [i for i, _ in list_checkpoints(run)] == [3]  # the damaged 3 replaced, then 2 pruned
    assert verify(run / "checkpoints" / "iter_000003") is None
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["iter_000003"]
