"""Atomic file writes: a crash leaves either the old file or the new one, never half of either.

The data goes to a temporary file in the same folder (created 0600, so a private file is never readable
by others, not even for an instant), is fsynced, renamed over the target, and on POSIX the folder is
fsynced so the rename itself is durable (Windows cannot open a folder for fsync; NTFS journals renames).
Everything the engine keeps on disk goes through here: keys, tokens, settings, checkpoints, counters.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path


def atomic_write(path: Path, data: bytes, *, private: bool = False) -> None:
    """Replace ``path`` with ``data``; ``private``: readable by the owner only (mode 0600)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            if not private:
                os.chmod(tmp, 0o644)
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    if os.name == "posix":
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
