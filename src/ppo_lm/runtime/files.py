"""Writing a user's files so that a crash, Ctrl-C or a full disk leaves the old or the new version,
never a cut one."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


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
