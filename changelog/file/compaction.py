"""Log compaction of a file changelog partition: keep the last record per key below a boundary.

Guarantees (``upto`` is typically the checkpointed offset):
- records with offset >= ``upto`` are never removed or changed;
- among records with offset < ``upto``, only the last one per key is kept; a kept tombstone is dropped
  too once its append timestamp is older than ``tombstone_retention`` (then every earlier record of
  that key below ``upto`` is gone as well, so a full restore yields the same state);
- offsets are preserved (gaps appear), record bytes are copied verbatim (crc unchanged);
- only sealed segments (every segment but the last) are rewritten: each into ``<name>.compacting``,
  fsynced, then atomically renamed over the original (a segment left empty is deleted). A reader that
  has the old file open keeps reading it; a reader opening by name sees either the old or the new file.
"""

from __future__ import annotations

import fcntl
import logging
import os
import threading
import time
import zlib
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping

from localstate.errors import ChangelogCorruptError, ChangelogError, LocalStateError

from .format import HEADER, HEADER_SIZE, list_segments, segment_name
from localstate.core.fsutil import fsync_dir, open_nofollow

if TYPE_CHECKING:
    from .system import FileChangelogSystem

__all__ = ["CompactionStats", "compact_partition", "compact_stream", "BackgroundCompactor", "COMPACT_LOCK"]

log = logging.getLogger(__name__)

COMPACT_LOCK = "compact.lock"
TMP_SUFFIX = ".compacting"


@dataclass
class CompactionStats:
    """What one compaction did. Records/bytes count the sealed segments below ``upto`` that were
    examined (the active segment is never rewritten)."""

    records_before: int = 0
    records_after: int = 0
    bytes_before: int = 0
    bytes_after: int = 0
    tombstones_dropped: int = 0
    segments_rewritten: int = 0
    segments_deleted: int = 0
    seconds: float = 0.0
    partitions: dict[int, "CompactionStats"] = field(default_factory=dict)

    def add(self, other: "CompactionStats") -> None:
        for name in ("records_before", "records_after", "bytes_before", "bytes_after", "tombstones_dropped",
                     "segments_rewritten", "segments_deleted", "seconds"):
            setattr(self, name, getattr(self, name) + getattr(other, name))

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def compact_partition(directory: Path, upto: int, *, tombstone_retention: float = 86400.0,
                      now: float | None = None, fsync: bool = True, stream: str = "changelog",
                      partition: int = 0) -> CompactionStats:
    """Compact one partition directory. See the module docstring for the guarantees.

    ``now`` (seconds since the epoch, default ``time.time()``) decides which tombstones are old enough.
    Raises ChangelogError if another compaction of the partition runs, ChangelogCorruptError if a
    record below ``upto`` fails its crc (nothing is rewritten from corrupt input).
    """
    started = time.perf_counter()
    stats = CompactionStats()
    directory = Path(directory)
    if not directory.is_dir():
        return stats
    now = time.time() if now is None else now
    cutoff_ms = int((now - tombstone_retention) * 1000)
    lock_fd = open_nofollow(directory / COMPACT_LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ChangelogError("another compaction of this partition is running", stream=stream,
                                 partition=partition, hint="wait for it to finish and try again") from None
        for name in os.listdir(directory):
            if name.endswith(TMP_SUFFIX):  # left over by a compaction that crashed
                os.unlink(directory / name)
        bases = list_segments(directory)
        sealed = [b for b in bases[:-1] if b < upto]
        if not sealed:
            return stats
        last = _last_offsets(directory, bases, upto, stream, partition)
        for base in sealed:
            _rewrite(directory, base, upto, last, cutoff_ms, fsync, stats)
        stats.seconds = time.perf_counter() - started
        log.info("compacted changelog %s partition %d below offset %d: %d -> %d records, %d -> %d bytes "
                 "in %.3fs", stream, partition, upto, stats.records_before, stats.records_after,
                 stats.bytes_before, stats.bytes_after, stats.seconds)
        return stats
    finally:
        os.close(lock_fd)  # closing releases the flock


def _last_offsets(directory: Path, bases: list[int], upto: int, stream: str, partition: int) -> dict[bytes, int]:
    """Pass 1: offset of the last record per key among records with offset < upto (crc-checked)."""
    unpack = HEADER.unpack_from
    crc32 = zlib.crc32
    last: dict[bytes, int] = {}
    for index, base in enumerate(bases):
        if base >= upto:
            break
        path = directory / segment_name(base)
        with open(path, "rb") as f:
            data = f.read()
        n = len(data)
        pos = 0
        with memoryview(data) as view:
            while pos < n:
                bad = pos + HEADER_SIZE > n
                if not bad:
                    crc, off, _ts, klen, vlen = unpack(data, pos)
                    kend = pos + HEADER_SIZE + klen
                    end = kend + vlen if vlen > 0 else kend
                    bad = end > n or crc32(view[pos + 4:end]) != crc
                if bad:
                    if index == len(bases) - 1:
                        break  # the active segment's tail may be in progress or torn: not ours to judge
                    raise ChangelogCorruptError(
                        "changelog record failed its integrity check during compaction", stream=stream,
                        partition=partition, segment=str(path), byte=pos,
                        hint="compaction stopped without changing anything; restore the partition from a "
                             "backup")
                if off >= upto:
                    return last
                last[data[pos + HEADER_SIZE:kend]] = off
                pos = end
    return last


def _rewrite(directory: Path, base: int, upto: int, last: dict[bytes, int], cutoff_ms: int, fsync: bool,
             stats: CompactionStats) -> None:
    """Pass 2: rewrite one sealed segment keeping what pass 1 decided; swap it in atomically."""
    unpack = HEADER.unpack_from
    path = directory / segment_name(base)
    with open(path, "rb") as f:
        data = f.read()
    n = len(data)
    out = bytearray()
    pos = 0
    run = 0          # start of the current run of kept records
    records = kept = tombstones = 0
    get = last.get
    while pos < n:
        _crc, off, ts, klen, vlen = unpack(data, pos)
        if off >= upto:
            # Everything from here on is at/after the boundary: keep verbatim (count only).
            while pos < n:
                _crc, off, ts, klen, vlen = unpack(data, pos)
                pos += HEADER_SIZE + klen + (vlen if vlen > 0 else 0)
                records += 1
                kept += 1
            break
        kend = pos + HEADER_SIZE + klen
        end = kend + vlen if vlen > 0 else kend
        records += 1
        keep = get(data[pos + HEADER_SIZE:kend]) == off
        if keep and vlen < 0 and ts < cutoff_ms:
            keep = False
            tombstones += 1
        if keep:
            kept += 1
        else:
            if run < pos:
                out += data[run:pos]
            run = end
        pos = end
    stats.records_before += records
    stats.records_after += kept
    stats.bytes_before += n
    stats.tombstones_dropped += tombstones
    if kept == records:
        stats.bytes_after += n
        return
    if run < n:
        out += data[run:n]
    stats.bytes_after += len(out)
    if not out:
        os.unlink(path)
        stats.segments_deleted += 1
    else:
        tmp = directory / (segment_name(base) + TMP_SUFFIX)
        with os.fdopen(open_nofollow(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), "wb") as f:
            f.write(out)
            f.flush()
            if fsync:
                os.fsync(f.fileno())
        os.replace(tmp, path)
        stats.segments_rewritten += 1
    if fsync:
        fsync_dir(directory)


def compact_stream(system: "FileChangelogSystem", stream: str, upto_by_partition: Mapping[int, int],
                   now: float | None = None) -> CompactionStats:
    """Compact every listed partition of ``stream`` below its ``upto`` offset (e.g. the checkpointed
    changelog offsets). Returns the totals, with per-partition figures in ``stats.partitions``."""
    started = time.perf_counter()
    total = CompactionStats()
    for partition, upto in sorted(upto_by_partition.items()):
        part = system.compact(stream, partition, upto, now=now)
        total.partitions[partition] = part
        total.add(part)
    total.seconds = time.perf_counter() - started
    return total


class BackgroundCompactor:
    """A daemon thread compacting every ``interval`` seconds. ``targets()`` returns
    ``{(stream, partition): upto}`` (the runtime passes its checkpointed changelog offsets)."""

    def __init__(self, system: "FileChangelogSystem", interval: float,
                 targets: Callable[[], Mapping[tuple[str, int], int]]) -> None:
        self.system = system
        self.interval = interval
        self.targets = targets
        self.runs = 0
        self.last_error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="localstate-compactor", daemon=True)

    def start(self) -> "BackgroundCompactor":
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self.run_once()

    def run_once(self) -> None:
        """One round over all targets; errors are logged, remembered and do not stop the thread."""
        try:
            targets = dict(self.targets())
        except Exception as exc:  # noqa: BLE001 - a failing callback must not kill the thread
            log.warning("background compaction: targets() failed: %s", exc)
            self.last_error = exc
            return
        for (stream, partition), upto in targets.items():
            if self._stop.is_set():
                return
            try:
                self.system.compact(stream, partition, upto)
            except (LocalStateError, OSError) as exc:
                log.warning("background compaction of %s partition %d failed: %s", stream, partition, exc)
                self.last_error = exc
        self.runs += 1

    def stop(self, timeout: float | None = 10.0) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)
