"""Writing a file so that a reader (or a process restarted after a crash) sees the old content or
the new, never half of it."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path


def write_atomic(path: str | Path, data: bytes | str, *, mode: int | None = None, durable: bool = False) -> None:
    """*data* into *path*: written to a new file of a random name in the same directory (created
    with O_EXCL, mode 0600 unless *mode*), then renamed over *path*. A symlink planted at *path* is
    replaced, not written through; on a failure the temp file is removed and *path* is unchanged.
    *durable*: fsync before the rename, so the new content survives a crash of the machine too.
    The directory must exist."""
    target = Path(path)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
