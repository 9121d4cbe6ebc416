"""Durable, symlink-refusing file-system primitives shared by the changelog, checkpoints and engines,
and the one place that turns an OS error at a file-system edge into a typed error with a hint.

Policy: below a directory localstate owns (the state directory, a changelog root), nothing is
followed through a symlink. Directories are checked component by component with ``lstat`` and
created one level at a time; files are opened with ``O_NOFOLLOW``. A symlink found there raises
:class:`~localstate.errors.UnsafePathError` before anything is written, truncated or deleted.

Directories that localstate creates for a job or a stream carry an ownership marker
(:data:`MARKER`); ``localstate reset`` deletes a directory only if it carries the right marker.
"""

from __future__ import annotations

import errno
import json
import os
import stat
import uuid
from pathlib import Path
from typing import Any, Callable

from localstate.errors import ResourceError, UnsafePathError

__all__ = ["MARKER", "fsync_dir", "write_atomic", "check_no_symlinks", "check_tree_no_symlinks", "ensure_dir",
           "open_nofollow", "read_nofollow", "read_regular", "make_owned_dir", "read_marker", "is_owned", "os_error", "os_error_hint",
           "errno_in_text"]

MARKER = ".localstate-owned"
"""File in a directory localstate created: JSON naming what the directory is (``kind``) and for whom."""

_SYMLINK_HINT = ("localstate never follows symlinks inside its state directory (or a changelog root): "
                 "remove the symlink, and if the data it points to is yours, move it out of the way; to keep "
                 "state elsewhere, point job.state_dir (or the changelog's path) at the real directory")


_OTHER_KIND_HINT = ("something else is where localstate keeps a file or directory of its own: move it out of the "
                    "way (localstate creates what it needs there)")


def _unsafe(path: Path | str, why: str) -> UnsafePathError:
    hint = _SYMLINK_HINT if "symlink" in why or "outside" in why else _OTHER_KIND_HINT
    return UnsafePathError(f"refusing to use {path}: {why}", path=str(path), hint=hint)


def fsync_dir(directory: Path) -> None:
    """fsync a directory so that created/renamed/deleted entries are durable."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _below(anchor: Path, path: Path) -> tuple[Path, list[str]]:
    """``anchor`` made absolute, and the components of ``path`` below it (lexically, ``..`` refused)."""
    anchor = Path(os.path.abspath(anchor))
    path = Path(os.path.abspath(path))
    if path != anchor and anchor not in path.parents:
        raise _unsafe(path, f"it is outside {anchor}")
    return anchor, list(path.relative_to(anchor).parts)


def check_no_symlinks(anchor: Path, path: Path) -> Path:
    """Return ``path`` (absolute) after checking that it lies inside ``anchor`` and that no existing
    component below ``anchor``, ``path`` included, is a symlink. ``anchor`` itself is the operator's
    choice and may be anything."""
    anchor, parts = _below(anchor, path)
    current = anchor
    for part in parts:
        current = current / part
        try:
            mode = os.lstat(current).st_mode
        except FileNotFoundError:
            break
        if stat.S_ISLNK(mode):
            raise _unsafe(current, "it is a symlink")
    return anchor.joinpath(*parts)


def check_tree_no_symlinks(directory: Path) -> None:
    """Refuse (UnsafePathError) ``directory`` if it is a symlink or holds one anywhere below it. For
    directories whose files a library opens by name (RocksDB, LMDB, tantivy): it would follow a
    planted symlink (RocksDB appends to ``LOG``, LMDB creates ``lock.mdb``). Nothing is touched; a
    missing directory passes."""
    try:
        if stat.S_ISLNK(os.lstat(directory).st_mode):
            raise _unsafe(directory, "it is a symlink")
        entries = list(os.scandir(directory))
    except (FileNotFoundError, NotADirectoryError):
        return
    for entry in entries:
        if entry.is_symlink():
            raise _unsafe(entry.path, "it is a symlink")
        if entry.is_dir(follow_symlinks=False):
            check_tree_no_symlinks(Path(entry.path))


def ensure_dir(anchor: Path, path: Path) -> bool:
    """Create ``path`` and its missing parents below ``anchor`` one level at a time, refusing any
    symlinked or non-directory component. Return True if ``path`` itself was created."""
    anchor, parts = _below(anchor, path)
    anchor.mkdir(parents=True, exist_ok=True)
    current, created = anchor, False
    for part in parts:
        current = current / part
        try:
            os.mkdir(current, 0o755)
            created = True
            continue
        except FileExistsError:
            created = False
        mode = os.lstat(current).st_mode
        if stat.S_ISLNK(mode):
            raise _unsafe(current, "it is a symlink")
        if not stat.S_ISDIR(mode):
            raise _unsafe(current, "it is not a directory")
    return created


def open_nofollow(path: Path, flags: int, mode: int = 0o644) -> int:
    """``os.open`` that refuses a symlink as the last component (UnsafePathError)."""
    try:
        return os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.EMLINK):
            raise _unsafe(path, "it is a symlink") from None
        raise


def read_nofollow(path: Path) -> bytes:
    """The whole content of ``path``, refusing a symlink (FileNotFoundError if missing)."""
    fd = open_nofollow(path, os.O_RDONLY)
    with os.fdopen(fd, "rb") as handle:
        return handle.read()


def read_regular(path: Path, limit: int, *, tail: bool = False) -> bytes:
    """At most ``limit`` bytes of ``path`` (its first ones, or with ``tail`` its last ones), which
    must be a regular file: a symlink is refused (UnsafePathError), and so is anything else that is
    no regular file (a directory, a FIFO that would block the reader, a device); FileNotFoundError if
    missing, other OSErrors as raised. For files anyone with access to the state directory may have
    replaced (what a job keeps for its operators)."""
    fd = open_nofollow(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise _unsafe(path, "it is not a regular file")
        start = max(0, info.st_size - max(0, int(limit))) if tail else 0
        size = min(info.st_size, start + max(0, int(limit)))
        os.lseek(fd, start, os.SEEK_SET)
        chunks, left = [], size - start
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


_HINTS = {
    errno.ENOSPC: "the disk is full: free space on that file system (or move state_dir / the output "
                   "path elsewhere) and run the job again; it resumes from its last checkpoint",
    errno.EDQUOT: "the disk quota is exhausted: free space or raise the quota, then run the job again",
    errno.EFBIG: "the file exceeds the process's file size limit (ulimit -f): raise the limit and run again",
    errno.EROFS: "the file system is read-only: remount it read-write or point the job at a writable "
                  "directory",
    errno.EACCES: "permission denied: give the job's user write access to that directory (or run as its owner)",
    errno.EPERM: "operation not permitted (immutable file or directory?): check `lsattr`, ownership and "
                  "permissions",
    errno.ENOENT: "the file or its directory does not exist (removed while the job ran?): recreate the "
                   "directory or fix the configured path",
    errno.ENOTDIR: "a path component is not a directory: fix the configured path",
    errno.EISDIR: "a directory is where a file is expected: remove or rename it",
    errno.EMFILE: "too many open files: raise the open-files limit (ulimit -n)",
    errno.EIO: "the device reported an I/O error (LMDB also reports a full disk this way): check free space "
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


def _discard(tmp: Path) -> None:
    """Remove a temporary file if it is there; on a read-only or broken file system there is
    nothing more to do than report the original error."""
    try:
        tmp.unlink(missing_ok=True)
    except OSError:
        pass


def write_atomic(path: Path, data: bytes, *, error: type[ResourceError] = ResourceError,
                 durable: bool = True) -> None:
    """Replace ``path`` with ``data`` durably (file and directory fsynced; ``durable=False``: not,
    for files that need no crash survival), so that readers see the old or the new file, never a mix.

    The temporary file name is unique per call, so concurrent writers (two Spark workers creating
    the same stream, say) never write into each other's temporary file; the last rename wins. The
    temporary file is created exclusively and never through a symlink; the rename replaces a
    symlink at ``path`` itself rather than writing where it points. An OS error (disk full,
    read-only, permissions) leaves the old file in place, removes the temporary file and is raised
    as ``error`` (a :class:`ResourceError`) naming ``path``.
    """
    path = Path(path)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        try:
            fd = open_nofollow(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
                if durable:
                    handle.flush()
                    os.fsync(handle.fileno())
            os.replace(tmp, path)
        except BaseException:
            _discard(tmp)
            raise
        if durable:
            fsync_dir(path.parent)
    except OSError as exc:
        raise os_error(exc, "write", path, error) from exc


def read_marker(directory: Path) -> dict[str, Any] | None:
    """The ownership marker of ``directory``, or None if it has none (or an unreadable one)."""
    try:
        data = json.loads(read_nofollow(Path(directory) / MARKER))
    except (OSError, ValueError, UnsafePathError):
        return None
    return data if isinstance(data, dict) and data.get("owner") == "localstate" else None


def is_owned(directory: Path, kind: str, **expect: Any) -> bool:
    """Whether ``directory`` is a real directory (not a symlink) carrying localstate's marker of
    ``kind`` with every ``expect`` field equal."""
    try:
        if not stat.S_ISDIR(os.lstat(directory).st_mode):
            return False
    except OSError:
        return False
    return _matches(read_marker(directory), kind, expect)


def _matches(marker: dict[str, Any] | None, kind: str, expect: dict[str, Any]) -> bool:
    return (marker is not None and marker.get("kind") == kind
            and all(marker.get(key) == value for key, value in expect.items()))


def _foreign(path: Path, kind: str, why: str) -> UnsafePathError:
    return UnsafePathError(f"refusing to use {path} as {kind} directory: {why}", path=str(path),
                           hint="move it away, or choose another job name, state_dir or changelog path")


def make_owned_dir(anchor: Path, path: Path, kind: str, *, layout: Callable[[str], bool] | None = None,
                   **info: Any) -> Path:
    """Create ``path`` like :func:`ensure_dir` and make sure it is localstate's ``kind`` directory for
    ``info``: a directory localstate creates (or finds empty: a crash between mkdir and marker) gets
    the marker. An unmarked directory whose every entry passes ``layout`` (state of a version that
    wrote no markers) is adopted; any other unmarked or differently-marked directory is refused
    (UnsafePathError): localstate writes nothing into what it did not create."""
    created = ensure_dir(anchor, path)
    path = Path(os.path.abspath(path))
    if not created:
        marker = read_marker(path)
        if marker is not None:
            if _matches(marker, kind, info):
                return path
            raise _foreign(path, kind, f"it belongs to {marker}")
        # Marker temp files of a concurrent creator (another Spark worker) do not count; if that
        # creator finishes meanwhile, this rewrites the same marker.
        entries = [e for e in os.listdir(path) if not e.startswith(MARKER)]
        if entries and not (layout and all(layout(entry) for entry in entries)):
            raise _foreign(path, kind, "it already exists and localstate did not create it")
    write_atomic(path / MARKER, json.dumps({"owner": "localstate", "kind": kind, **info}, sort_keys=True).encode())
    return path
