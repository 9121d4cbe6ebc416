"""Waiting for appends to local files in the kernel (Linux inotify, through ctypes on libc), so that
a file-following input (:class:`~localstate.core.stream.WaitableInput`) can sleep until a file of
its directory changes instead of being probed again and again.

:class:`FileWatch` holds one inotify descriptor (opened on the first :meth:`FileWatch.watch`, closed
by :meth:`FileWatch.close`) and a bounded set of directory watches. Where inotify cannot be used
(not Linux, no libc, the user's inotify instances or watches used up), it says so
(:attr:`FileWatch.available` is False, logged once) and the input falls back to being probed.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import logging
import os
import select
import struct
import time
from pathlib import Path
from typing import Callable, Sequence

__all__ = ["FileWatch", "WatchedFiles", "wait_for_files", "WATCH_MASK"]

log = logging.getLogger(__name__)

_IN_MODIFY = 0x002
_IN_MOVED_TO = 0x080
_IN_CREATE = 0x100
_IN_DELETE_SELF = 0x400
_IN_MOVE_SELF = 0x800
_IN_Q_OVERFLOW = 0x4000
_IN_IGNORED = 0x8000
_IN_ONLYDIR = 0x01000000
_IN_NONBLOCK = os.O_NONBLOCK
_IN_CLOEXEC = 0o2000000

WATCH_MASK = _IN_MODIFY | _IN_CREATE | _IN_MOVED_TO | _IN_DELETE_SELF | _IN_MOVE_SELF | _IN_ONLYDIR
"""What wakes a wait: a file of the directory written, created or renamed in; the directory itself
deleted or moved (its watch is then gone and is added again, or the input is probed instead)."""

_EVENT = struct.Struct("iIII")
_READ_BYTES = 64 * 1024
MAX_WATCHES = 1024
"""Directories one :class:`FileWatch` watches at most (a file input watches one per partition of
its task's group, plus the stream's directory)."""

_libc: ctypes.CDLL | None = None


def _load_libc() -> ctypes.CDLL:
    global _libc
    if _libc is None:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        libc.inotify_init1.argtypes = [ctypes.c_int]
        libc.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
        libc.inotify_rm_watch.argtypes = [ctypes.c_int, ctypes.c_int]
        _libc = libc
    return _libc


class FileWatch:
    """Directory watches on one inotify descriptor. Not thread safe: the input's waiting thread
    uses it. ``stream`` names the input in the log lines."""

    def __init__(self, stream: str) -> None:
        self.stream = stream
        self.available = True
        """False once inotify could not be used: the input is probed instead (see :meth:`_give_up`)"""
        self._fd = -1
        self._poller: select.poll | None = None
        self._watches: dict[int, Path] = {}  # wd -> directory
        self._by_path: dict[Path, int] = {}

    @property
    def fd(self) -> int:
        """The inotify descriptor (-1 while none is open)."""
        return self._fd

    def _give_up(self, why: str, level: int = logging.WARNING) -> None:
        if self.available:
            log.log(level, "input %r: cannot wait for appends with inotify (%s): probing its files instead",
                    self.stream, why)
        self.available = False
        self.close()

    def _open(self) -> bool:
        if self._fd >= 0:
            return True
        if not self.available:
            return False
        try:
            libc = _load_libc()
            fd = libc.inotify_init1(_IN_NONBLOCK | _IN_CLOEXEC)
        except (OSError, AttributeError) as exc:  # no libc, or a libc without inotify (not Linux)
            self._give_up(f"no inotify in this C library: {exc}", logging.DEBUG)
            return False
        if fd < 0:
            code = ctypes.get_errno()
            self._give_up(f"inotify_init1: {os.strerror(code)}; raise fs.inotify.max_user_instances"
                          if code == errno.EMFILE else f"inotify_init1: {os.strerror(code)}")
            return False
        self._fd = fd
        self._poller = select.poll()
        self._poller.register(fd, select.POLLIN)
        return True

    def watch(self, directory: Path, required: bool = True) -> bool:
        """Watch ``directory`` (no-op when already watched); True when it was added just now (the
        caller then looks at the files once: what was appended before the watch raised no event).
        A ``required`` directory that cannot be watched makes the watch unavailable; an optional one
        that does not exist yet (a partition's directory) is skipped."""
        directory = Path(directory)
        if directory in self._by_path or not self._open():
            return False
        if len(self._watches) >= MAX_WATCHES:  # an unwatched partition would wait for nothing
            self._give_up(f"more than {MAX_WATCHES} directories to watch")
            return False
        wd = _load_libc().inotify_add_watch(self._fd, os.fsencode(directory), WATCH_MASK)
        if wd < 0:
            code = ctypes.get_errno()
            if not required and code == errno.ENOENT:
                return False  # created later: the event in its parent's watch says so
            hint = "; raise fs.inotify.max_user_watches" if code == errno.ENOSPC else ""
            self._give_up(f"watch {directory}: {os.strerror(code)}{hint}")
            return False
        self._watches[wd] = directory
        self._by_path[directory] = wd
        return True

    def wait(self, timeout: float) -> list[tuple[Path, str]] | None:
        """Block up to ``timeout`` seconds for events; ``(directory, file name)`` of each (name ""
        for the directory itself, and for a lost event queue: look at everything); [] on timeout;
        None when the watch became unavailable meanwhile."""
        if self._fd < 0 or self._poller is None:
            return None
        try:
            if not self._poller.poll(max(0, int(timeout * 1000 + 0.999))):
                return []
            data = os.read(self._fd, _READ_BYTES)
        except BlockingIOError:
            return []
        except InterruptedError:
            return []
        except OSError as exc:
            self._give_up(f"read: {exc.strerror or exc}")
            return None
        return self._events(data)

    def _events(self, data: bytes) -> list[tuple[Path, str]]:
        events: list[tuple[Path, str]] = []
        at = 0
        while at + _EVENT.size <= len(data):
            wd, mask, _cookie, length = _EVENT.unpack_from(data, at)
            name = data[at + _EVENT.size:at + _EVENT.size + length].rstrip(b"\0")
            at += _EVENT.size + length
            if mask & _IN_Q_OVERFLOW:
                events.append((Path(), ""))
                continue
            directory = self._watches.get(wd)
            if directory is None:
                continue
            if mask & _IN_IGNORED:  # the directory was deleted or moved: its watch is gone
                del self._watches[wd]
                self._by_path.pop(directory, None)
            events.append((directory, os.fsdecode(name)))
        return events

    def close(self) -> None:
        """Close the descriptor (its watches go with it). Idempotent; a later :meth:`watch` opens
        another while inotify is available."""
        fd, self._fd = self._fd, -1
        self._poller = None
        self._watches.clear()
        self._by_path.clear()
        if fd >= 0:
            os.close(fd)


def wait_for_files(watch: FileWatch, directories: Sequence[tuple[Path, bool]], touched: Callable[[Path, str], bool],
                   holds: Callable[[], bool], timeout: float) -> bool:
    """The :meth:`~localstate.core.stream.WaitableInput.wait_for_records` of a file input: watch
    ``directories`` (``(path, required)``), then wait until an event that ``touched`` says concerns
    the waiting partitions is followed by ``holds()`` (a complete record past a position: the input's
    own end probe), or ``timeout`` passes (False). Bytes below the positions and an unterminated
    tail wake the wait but do not end it. Without inotify (``watch.available`` False): True at once,
    so that the caller probes (it sleeps between a wait that woke for nothing and the next)."""
    deadline = time.monotonic() + timeout
    while True:
        added = [watch.watch(path, required) for path, required in directories]
        if not watch.available:
            return True
        if any(added) and holds():
            return True
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        events = watch.wait(remaining)
        if events is None:
            return True
        if any(not name or touched(directory, name) for directory, name in events) and holds():
            return True


class WatchedFiles:
    """What a file input that waits with a :class:`FileWatch` (in ``self._watch``) has in common
    as a :class:`~localstate.core.stream.WaitableInput`; the input adds ``wait_for_records``."""

    _watch: FileWatch

    def wakes_at_once(self) -> bool:
        """Yes: the kernel wakes the wait at the append."""
        return True

    def can_wait(self) -> bool:
        """Whether ``wait_for_records`` waits in the kernel (inotify): else the input is probed."""
        return self._watch.available

    def close(self) -> None:
        """Close the inotify descriptor of ``wait_for_records`` (if one was opened)."""
        self._watch.close()
