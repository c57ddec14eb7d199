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
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
