"""Writing a user's files so that a crash, Ctrl-C or a full disk leaves the old or the new version,
never a cut one."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from .errors import UserError


def atomic_write_text(path: str | Path, text: str) -> None:
    """Replace ``path``'s content with ``text``: written to a temporary file in the same directory,
    flushed to disk, then renamed over ``path`` (a rename within a file system is atomic)."""
    path = Path(path)
    if path.exists():
        mode = path.stat().st_mode & 0o777
    else:  # what open() would have given: 0o666 less the umask (read by setting it, then back)
        umask = os.umask(0o022)
        os.umask(umask)
        mode = 0o666 & ~umask
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, mode)  # mkstemp makes 0o600 files
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def prepare_output_dir(path: str | Path, field: str = "output_dir") -> Path:
    """Create ``path`` (and its parents) and check that files can be written in it — before any model
    loads, so a typo costs a second, not the minutes a big model takes. Raises ``OSError`` subclasses
    as :class:`ValueError` naming ``field`` and the fix."""
    path = Path(path)
    for p in (path, *path.parents):
        if p.exists():
            if not p.is_dir():
                where = "is a file" if p == path else f"is under {str(p)!r}, which is a file"
                raise ValueError(f"`{field}` {str(path)!r} {where}, not a directory; choose another --{field.replace('_', '-')}")
            break
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as e:
        raise ValueError(f"`{field}` {str(path)!r} is not writable ({e.strerror or e}); choose another "
                         f"--{field.replace('_', '-')}") from None
    return path


LOCK_NAME = ".ppo-lm.lock"


class OutputDirBusy(UserError):
    """Another live process holds the output folder's lock."""


class OutputDirLock:
    """An exclusive ``flock`` on ``<output_dir>/.ppo-lm.lock``, held while a run writes the folder, so
    that two runs never write one folder's checkpoints and logs at once (a job requeued while its
    first attempt still runs, a launcher killed while its ranks go on). The kernel drops the lock when
    its holder dies, even by SIGKILL, so a crash never leaves a stale one. The file holds the holder's
    pid, for the message."""

    def __init__(self, output_dir: str | Path):
        self.path = Path(output_dir) / LOCK_NAME
        self._fd: int | None = None

    def acquire(self) -> OutputDirLock:
        """Raises :class:`OutputDirBusy` naming the holder's pid and the fix."""
        import fcntl

        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise OutputDirBusy(f"another process (pid {holder}) is writing to {str(self.path.parent)!r}: a run "
                                f"already uses this folder; stop that run first, or choose another --output-dir") from None
        except OSError:  # a file system without locks (some network mounts): the run goes on unguarded
            os.close(fd)
            return self
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing drops the flock
            self._fd = None

    def __enter__(self) -> OutputDirLock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()
