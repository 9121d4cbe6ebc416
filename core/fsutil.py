"""Durable file-system primitives shared by the changelog, checkpoints and engines, and the one
place that turns an OS error at a file-system edge into a typed error with a hint."""

from __future__ import annotations

import errno as _errno
import os
import uuid
from pathlib import Path
from typing import Any

from localstate.errors import ResourceError

__all__ = ["fsync_dir", "write_atomic", "os_error", "os_error_hint", "errno_in_text"]

_HINTS = {
    _errno.ENOSPC: "the disk is full: free space on that file system (or move state_dir / the output "
                   "path elsewhere) and run the job again; it resumes from its last checkpoint",
    _errno.EDQUOT: "the disk quota is exhausted: free space or raise the quota, then run the job again",
    _errno.EFBIG: "the file exceeds the process's file size limit (ulimit -f): raise the limit and run again",
    _errno.EROFS: "the file system is read-only: remount it read-write or point the job at a writable "
                  "directory",
    _errno.EACCES: "permission denied: give the job's user write access to that directory (or run as its owner)",
    _errno.EPERM: "operation not permitted (immutable file or directory?): check `lsattr`, ownership and "
                  "permissions",
    _errno.ENOENT: "the file or its directory does not exist (removed while the job ran?): recreate the "
                   "directory or fix the configured path",
    _errno.ENOTDIR: "a path component is not a directory: fix the configured path",
    _errno.EISDIR: "a directory is where a file is expected: remove or rename it",
    _errno.EMFILE: "too many open files: raise the open-files limit (ulimit -n)",
    _errno.EIO: "the device reported an I/O error (LMDB also reports a full disk this way): check free space "
                "and the disk (dmesg) before running again",
}


def os_error_hint(code: int | None) -> str:
    """What an operator should do about OS error ``code``."""
    return _HINTS.get(code or 0, "check the file system (space, permissions, mount) at that path and run again")


def errno_in_text(text: str) -> int | None:
    """The OS error a backend's message reports (RocksDB raises a plain Exception such as
    ``"IO error: No space left on device"``, LMDB an ``lmdb.Error`` with ``strerror`` text), or None
    when the text names none of the resource errors in the hints table."""
    for code in _HINTS:
        if os.strerror(code) in text:
            return code
    return None


def os_error(exc: OSError, action: str, path: str | os.PathLike[str] | None = None,
             cls: type[ResourceError] = ResourceError, **context: Any) -> ResourceError:
    """Build a typed ``cls`` for ``exc`` raised while doing ``action`` (``"write checkpoint"``) on
    ``path``: the message names the file and the OS reason, the hint says what to do. The caller
    raises it ``from exc``."""
    where = path if path is not None else exc.filename
    reason = exc.strerror or str(exc)
    return cls(f"cannot {action} {where}: {reason}", errno=exc.errno, hint=os_error_hint(exc.errno),
               path=str(where) if where is not None else None, **context)


def fsync_dir(directory: Path) -> None:
    """fsync a directory so that created/renamed/deleted entries are durable."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _discard(tmp: Path) -> None:
    """Remove a temporary file if it is there; on a read-only or broken file system there is
    nothing more to do than report the original error."""
    try:
        tmp.unlink(missing_ok=True)
    except OSError:
        pass


def write_atomic(path: Path, data: bytes, *, error: type[ResourceError] = ResourceError) -> None:
    """Replace ``path`` with ``data`` durably (file and directory fsynced), so that readers see the
    old or the new file, never a mix.

    The temporary file name is unique per call, so concurrent writers (two Spark workers creating
    the same stream, say) never write into each other's temporary file; the last rename wins.
    An OS error (disk full, read-only, permissions) leaves the old file in place, removes the
    temporary file and is raised as ``error`` (a :class:`ResourceError`) naming ``path``.
    """
    path = Path(path)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        try:
            with open(tmp, "wb") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, path)
        except BaseException:
            _discard(tmp)
            raise
        fsync_dir(path.parent)
    except OSError as exc:
        raise os_error(exc, "write", path, error) from exc
