"""Durable file-system primitives shared by the changelog, checkpoints and engines."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

__all__ = ["fsync_dir", "write_atomic"]


def fsync_dir(directory: Path) -> None:
    """fsync a directory so that created/renamed/deleted entries are durable."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` durably (file and directory fsynced), so that readers see the
    old or the new file, never a mix.

    The temporary file name is unique per call, so concurrent writers (two Spark workers creating
    the same stream, say) never write into each other's temporary file; the last rename wins.
    """
    path = Path(path)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        with open(tmp, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)
