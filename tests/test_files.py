"""A user's files are replaced whole or not at all."""

from __future__ import annotations

import json
import os

import pytest

from ppo_lm.records.metrics_log import truncate_jsonl
from ppo_lm.runtime.files import atomic_write_text


def test_a_failed_rewrite_leaves_the_old_file(tmp_path, monkeypatch):
    path = tmp_path / "metrics.jsonl"
    old = "".join(json.dumps({"iteration": i}) + "\n" for i in range(1, 6))
    path.write_text(old)

    def disk_full(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", disk_full)
    with pytest.raises(OSError, match="No space"):
        truncate_jsonl(path, 3)
    assert path.read_text() == old
    assert [p.name for p in tmp_path.iterdir()] == ["metrics.jsonl"]  # no temporary file left behind


def test_truncate_keeps_rows_up_to_the_iteration(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps({"iteration": i}) + "\n" for i in range(1, 6)) + '{"iteration": 6, "cut')
    truncate_jsonl(path, 3)
    assert [json.loads(x)["iteration"] for x in path.read_text().splitlines()] == [1, 2, 3]
    atomic_write_text(path, "x\n")
    assert path.read_text() == "x\n"


def test_rewritten_files_keep_their_permissions(tmp_path):
    old = os.umask(0o022)
    try:
        fresh = tmp_path / "config.yaml"
        atomic_write_text(fresh, "a: 1\n")
        assert fresh.stat().st_mode & 0o777 == 0o644  # as open() would have made it
        shared = tmp_path / "metrics.jsonl"
        shared.write_text("")
        shared.chmod(0o664)
        atomic_write_text(shared, "{}\n")
        assert shared.stat().st_mode & 0o777 == 0o664
    finally:
        os.umask(old)


def _holder(out):
    """Another process holding ``out``'s lock until it is killed."""
    import subprocess
    import sys

    code = ("import sys, time; from ppo_lm.runtime.files import OutputDirLock; OutputDirLock(sys.argv[1]).acquire(); "
            "print('held', flush=True); time.sleep(600)")
    proc = subprocess.Popen([sys.executable, "-c", code, str(out)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_an_output_folder_another_process_writes_is_refused_until_it_dies(tmp_path):
    import signal

    from ppo_lm.runtime.files import OutputDirBusy, OutputDirLock

    proc = _holder(tmp_path)
    try:
        with pytest.raises(OutputDirBusy, match=rf"pid {proc.pid}\).*--output-dir"):
            OutputDirLock(tmp_path).acquire()
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    with OutputDirLock(tmp_path) as lock:  # the kernel dropped a killed holder's lock
        with pytest.raises(OutputDirBusy):  # one process, two claims: the second is refused too
            OutputDirLock(tmp_path).acquire()
    assert lock._fd is None
    OutputDirLock(tmp_path).acquire().release()


def test_a_file_system_without_locks_runs_unguarded(tmp_path, monkeypatch):
    """Where flock is not supported (some network mounts answer ENOLCK) the run goes on without the lock."""
    import errno
    import fcntl

    from ppo_lm.runtime.files import OutputDirLock

    def no_locks(fd, op):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", no_locks)
    with OutputDirLock(tmp_path) as lock:
        assert lock._fd is None
        OutputDirLock(tmp_path).acquire().release()
