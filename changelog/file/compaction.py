"""Log compaction of a file changelog partition: keep the last record per key below a boundary.

Guarantees (``upto`` is typically the checkpointed offset):
- records with offset >= ``upto`` are never removed or changed;
- among records with offset < ``upto``, only the last one per key is kept; a kept tombstone is dropped
  too once its append timestamp is older than ``tombstone_retention`` (then every earlier record of
  that key below ``upto`` is gone as well, so a full restore yields the same state);
- offsets are preserved (gaps appear), record bytes are copied verbatim (crc unchanged);
- only sealed segments (every segment but the last) are rewritten: each into ``<name>.compacting``,
  fsynced, then atomically renamed over the original (a segment left empty is deleted). A reader that
  has the old file open keeps reading it; a reader opening by name sees either the old or the new file;
- every gap compaction makes is recorded first, durably, in the partition's manifest
  (``compaction.json``, :class:`CompactionManifest`): the end each rewritten segment covered, the offset
  ranges of the segments it deleted, and the tombstone horizon (1 + the highest offset of a tombstone it
  dropped). Readers accept a gap between segments only if the manifest explains it, so a segment file
  deleted by anyone else is an error; recovery rebuilds a store whose local offset is below the horizon;
- compaction refuses (ChangelogCorruptError) to run over a gap the manifest does not explain, so it
  never makes such a loss look legitimate.
"""

from __future__ import annotations

import bisect
import fcntl
import json
import logging
import os
import subprocess
import sys
import threading
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Mapping

from localstate.core.changelog import CompactionStats
from localstate.errors import ChangelogCorruptError, ChangelogError, LocalStateError

from localstate.changelog.framing import HEADER, HEADER_SIZE
from .format import list_segments, segment_name
from localstate.core.fsutil import fsync_dir, open_nofollow, read_nofollow, write_atomic

if TYPE_CHECKING:
    from .system import FileChangelogSystem

__all__ = ["CompactionStats", "CompactionManifest", "compact_partition", "compact_stream", "BackgroundCompactor",
           "COMPACT_LOCK", "MANIFEST", "check_gap", "check_last_segment"]

log = logging.getLogger(__name__)

PARENT_OPTION = "--parent"
"""The compaction child's one argument, followed by the pid of the process that starts it
(:mod:`.compaction_child` exits at once when that process is already gone)."""

COMPACT_LOCK = "compact.lock"
MANIFEST = "compaction.json"
TMP_SUFFIX = ".compacting"
_MISSING_HINT = ("a changelog segment file was deleted or lost (not by compaction): the records in it are gone. "
                 "Restore the partition directory from a backup, or reset the job (`localstate reset`) to "
                 "rebuild state from the inputs")


@dataclass
class CompactionManifest:
    """The durable record of what compaction removed from one partition (``compaction.json``).

    ``ends[base]``: the offset the segment ``base`` reached when compaction rewrote it (its records may
    legitimately stop anywhere before it); ``removed``: ``[start, end)`` offset ranges of segment files
    compaction deleted, merged; ``horizon``: 1 + the highest offset of a tombstone compaction dropped
    (0: none), a store whose local offset is below it must be rebuilt from scratch.
    """

    ends: dict[int, int] = field(default_factory=dict)
    removed: list[tuple[int, int]] = field(default_factory=list)
    horizon: int = 0

    @classmethod
    def load(cls, directory: Path, stream: str = "changelog", partition: int = 0) -> "CompactionManifest":
        """The manifest of ``directory`` (empty if there is none)."""
        path = Path(directory) / MANIFEST
        try:
            raw = json.loads(path.read_bytes())
            return cls({int(b): int(e) for b, e in raw["ends"].items()},
                       [(int(a), int(b)) for a, b in raw["removed"]], int(raw["horizon"]))
        except FileNotFoundError:
            return cls()
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ChangelogCorruptError(f"unreadable compaction manifest: {exc}", stream=stream,
                                        partition=partition, path=str(path),
                                        hint="restore the file from a backup; without it, gaps that "
                                             "compaction made cannot be told from lost segments") from exc

    def save(self, directory: Path) -> None:
        data = {"format": 1, "ends": {str(b): e for b, e in sorted(self.ends.items())},
                "removed": [list(r) for r in self.removed], "horizon": self.horizon}
        write_atomic(Path(directory) / MANIFEST, json.dumps(data).encode())

    def remove(self, start: int, end: int) -> None:
        """Record that the offsets ``[start, end)`` (one whole segment) were deleted."""
        self.ends.pop(start, None)
        ranges = sorted(self.removed + [(start, end)])
        merged: list[tuple[int, int]] = []
        for a, b in ranges:
            if merged and a <= merged[-1][1]:
                merged[-1] = (merged[-1][0], max(merged[-1][1], b))
            else:
                merged.append((a, b))
        self.removed = merged

    def unexplained(self, base: int | None, position: int, target: int) -> int | None:
        """The first offset in ``[position, target)`` whose absence compaction does not explain, or
        None. ``position`` is the end of what segment ``base`` holds (None: before the first segment)
        and ``target`` where the records continue."""
        end = self.ends.get(base) if base is not None else None
        if end is not None and position <= end:
            position = end
        starts = [a for a, _ in self.removed]
        while position < target:
            at = bisect.bisect_right(starts, position) - 1
            if at < 0 or self.removed[at][1] <= position:
                return position
            position = self.removed[at][1]
        return None


def check_last_segment(directory: Path, base: int, *, stream: str, partition: int) -> None:
    """Raise ChangelogCorruptError if compaction recorded that segment ``base``, the last one on disk,
    was followed by others: compaction never touches the active segment, so they were lost, and a
    writer resuming here would reuse their offsets."""
    manifest = CompactionManifest.load(directory, stream, partition)
    if base not in manifest.ends:
        return
    first = manifest.unexplained(None, manifest.ends[base], manifest.ends[base] + 1)
    first = manifest.ends[base] if first is None else first
    missing = directory / segment_name(first)
    raise ChangelogCorruptError(
        f"changelog segment {missing.name} is missing: the partition ends with segment {segment_name(base)}, "
        f"which compaction rewrote when segments followed it", stream=stream, partition=partition,
        segment=str(missing), offset=first, path=str(directory), hint=_MISSING_HINT)


def check_gap(directory: Path, base: int | None, position: int, target: int, *, stream: str,
              partition: int, manifest: CompactionManifest | None = None) -> None:
    """Raise ChangelogCorruptError unless the offsets ``[position, target)`` missing between segment
    ``base`` (None: the start of the partition) and the segment ``target`` were removed by compaction."""
    if position >= target:
        return
    if manifest is None:
        manifest = CompactionManifest.load(directory, stream, partition)
    first = manifest.unexplained(base, position, target)
    if first is None:
        return
    missing = directory / segment_name(first)
    raise ChangelogCorruptError(
        f"changelog segment {missing.name} is missing: records at offsets {first}..{target - 1} are gone "
        f"and compaction did not remove them", stream=stream, partition=partition, segment=str(missing),
        offset=first, path=str(directory), hint=_MISSING_HINT)


def compact_partition(directory: Path, upto: int, *, tombstone_retention: float = 86400.0,
                      now: float | None = None, fsync: bool = True, stream: str = "changelog",
                      partition: int = 0) -> CompactionStats:
    """Compact one partition directory. See the module docstring for the guarantees.

    ``now`` (seconds since the epoch, default ``time.time()``) decides which tombstones are old enough.
    Raises ChangelogError if another compaction of the partition runs, ChangelogCorruptError if a
    record below ``upto`` fails its crc or a segment below ``upto`` is missing (nothing is rewritten
    from corrupt or incomplete input).
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
        manifest = CompactionManifest.load(directory, stream, partition)
        stats.records_before, stats.bytes_before = _totals(directory, bases)
        stats.records_after, stats.bytes_after = stats.records_before, stats.bytes_before
        stats.horizon = manifest.horizon
        sealed = [b for b in bases[:-1] if b < upto]
        if not sealed:
            return stats
        last, dead = _last_offsets(directory, bases, upto, cutoff_ms, manifest, stream, partition)
        # Decide, before changing any file, which segments end up empty, and record every gap this
        # compaction will make (and the tombstone horizon) durably first.
        kept = sorted(set(last.values()).difference(dead.values()))
        following = dict(zip(bases, bases[1:]))
        emptied = set()
        for base in sealed:
            end = following[base]
            manifest.ends[base] = end
            if end <= upto and bisect.bisect_left(kept, base) == bisect.bisect_left(kept, end):
                emptied.add(base)
                manifest.remove(base, end)
        if dead:
            manifest.horizon = max(manifest.horizon, max(dead.values()) + 1)
        manifest.save(directory)
        stats.horizon = manifest.horizon
        for base in sealed:
            _rewrite(directory, base, upto, last, cutoff_ms, fsync, stats, base in emptied)
        stats.seconds = time.perf_counter() - started
        log.info("compacted changelog %s partition %d below offset %d: %d -> %d records, %d -> %d bytes "
                 "in %.3fs", stream, partition, upto, stats.records_before, stats.records_after,
                 stats.bytes_before, stats.bytes_after, stats.seconds)
        return stats
    finally:
        os.close(lock_fd)  # closing releases the flock


def _totals(directory: Path, bases: list[int]) -> tuple[int, int]:
    """Records and bytes of every segment of the partition (headers only; a torn tail is not counted)."""
    unpack = HEADER.unpack_from
    records = size = 0
    for base in bases:
        try:
            data = read_nofollow(directory / segment_name(base))
        except FileNotFoundError:
            continue
        n = len(data)
        size += n
        pos = 0
        while pos + HEADER_SIZE <= n:
            _crc, _off, _ts, klen, vlen = unpack(data, pos)
            pos += HEADER_SIZE + klen + (vlen if vlen > 0 else 0)
            if pos > n:
                break
            records += 1
    return records, size


def _last_offsets(directory: Path, bases: list[int], upto: int, cutoff_ms: int, manifest: CompactionManifest,
                  stream: str, partition: int) -> tuple[dict[bytes, int], dict[bytes, int]]:
    """Pass 1 over the records with offset < upto (crc-checked, segment continuity checked): the
    offset of the last record per key, and the keys whose last record is a tombstone older than the
    cutoff (it will be dropped) with that offset."""
    unpack = HEADER.unpack_from
    crc32 = zlib.crc32
    last: dict[bytes, int] = {}
    dead: dict[bytes, int] = {}
    if bases and bases[0] > 0:
        check_gap(directory, None, 0, min(bases[0], upto), stream=stream, partition=partition, manifest=manifest)
    for index, base in enumerate(bases):
        if base >= upto:
            break
        path = directory / segment_name(base)
        data = read_nofollow(path)
        n = len(data)
        pos = 0
        position = base  # the offset after the last record seen in this segment
        with memoryview(data) as view:
            while pos < n:
                bad = pos + HEADER_SIZE > n
                if not bad:
                    crc, off, ts, klen, vlen = unpack(data, pos)
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
                    return last, dead
                key = data[pos + HEADER_SIZE:kend]
                last[key] = off
                if vlen < 0 and ts < cutoff_ms:
                    dead[key] = off
                elif dead:
                    dead.pop(key, None)
                position = off + 1
                pos = end
        if index + 1 < len(bases):
            check_gap(directory, base, position, min(bases[index + 1], upto), stream=stream,
                      partition=partition, manifest=manifest)
    return last, dead


def _rewrite(directory: Path, base: int, upto: int, last: dict[bytes, int], cutoff_ms: int, fsync: bool,
             stats: CompactionStats, may_delete: bool) -> None:
    """Pass 2: rewrite one sealed segment keeping what pass 1 decided; swap it in atomically. A segment
    left empty is deleted only if ``may_delete`` (the manifest records its range), else kept empty."""
    unpack = HEADER.unpack_from
    path = directory / segment_name(base)
    data = read_nofollow(path)
    n = len(data)
    out = bytearray()
    pos = 0
    run = 0          # start of the current run of kept records
    records = kept = tombstones = 0
    get = last.get
    while pos < n:
        _crc, off, ts, klen, vlen = unpack(data, pos)
        if off >= upto:
            break  # everything from here on is at/after the boundary: kept verbatim
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
    stats.tombstones_dropped += tombstones
    if kept == records:
        return
    if run < n:
        out += data[run:n]
    stats.records_after -= records - kept
    stats.bytes_after -= n - len(out)
    if not out and may_delete:
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
    ``{(stream, partition): upto}`` (the runtime passes its checkpointed changelog offsets).
    Each round runs in a short-lived child process by default (``in_child``), so that a process that
    runs for weeks does not keep the round's peak memory.

    It never seals an active segment itself (``roll=False``): a writer of the partition may be opening
    at any moment, and only writers roll (the runtime asks them to, see ``runtime.spark.runner``)."""

    def __init__(self, system: "FileChangelogSystem", interval: float,
                 targets: Callable[[], Mapping[tuple[str, int], int]], *, in_child: bool = True) -> None:
        self.system = system
        self.interval = interval
        self.targets = targets
        self.runs = 0
        self.last_error: BaseException | None = None
        self.last_stats: CompactionStats | None = None
        self.in_child = in_child
        """run each round in a child process (:mod:`.compaction_child`), so its memory is returned"""
        self._child: subprocess.Popen[bytes] | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="localstate-compactor", daemon=True)

    def start(self) -> "BackgroundCompactor":
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self.run_once()

    def run_once(self) -> CompactionStats:
        """One round over all targets; errors are logged, remembered and do not stop the thread.
        Returns the round's totals (also kept as ``last_stats``)."""
        total = CompactionStats()
        started = time.perf_counter()
        try:
            targets = dict(self.targets())
        except Exception as exc:  # noqa: BLE001 - a failing callback must not kill the thread
            log.warning("background compaction: targets() failed: %s", exc)
            self.last_error = exc
            return total
        if self.in_child:
            self._run_in_child(targets, total)
        else:
            for (stream, partition), upto in targets.items():
                if self._stop.is_set():
                    return total
                try:
                    total.add(self.system.compact(stream, partition, upto, roll=False))
                except (LocalStateError, OSError) as exc:
                    log.warning("background compaction of %s partition %d failed: %s", stream, partition, exc)
                    self.last_error = exc
        total.seconds = time.perf_counter() - started
        self.last_stats = total
        self.runs += 1
        return total

    def _run_in_child(self, targets: Mapping[tuple[str, int], int], total: CompactionStats) -> None:
        """The round in ``python -m localstate.changelog.file.compaction_child`` (see there why)."""
        request = {"options": self.system.config, "state_dir": str(self.system.state_dir),
                   "targets": [[stream, partition, upto] for (stream, partition), upto in sorted(targets.items())]}
        try:
            self._child = subprocess.Popen(
                [sys.executable, "-m", "localstate.changelog.file.compaction_child", PARENT_OPTION, str(os.getpid())],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, close_fds=True)
            out, err = self._child.communicate(json.dumps(request).encode())
            code = self._child.returncode
        except OSError as exc:
            log.warning("background compaction: could not start its child process (%s)", exc)
            self.last_error = exc
            return
        finally:
            self._child = None
        if code != 0:
            if not self._stop.is_set():  # stop() kills a running child: not worth a warning
                detail = err.decode(errors="replace").strip().splitlines()[-1:] or [f"exit status {code}"]
                self.last_error = ChangelogError(f"the compaction child process failed: {detail[0]}",
                                                 hint="see the job's log; the next round retries")
                log.warning("background compaction: %s", self.last_error)
            return
        answer = json.loads(out)
        total.add(CompactionStats(**{name: answer["stats"][name] for name in CompactionStats.TOTALS}))
        for failure in answer["errors"]:
            log.warning("background compaction of %s partition %s failed: %s", failure["stream"],
                        failure["partition"], failure["error"])
            self.last_error = ChangelogError(f"compaction failed: {failure['error']}", stream=failure["stream"],
                                             partition=failure["partition"])

    def stop(self, timeout: float | None = 10.0) -> None:
        self._stop.set()
        child = self._child
        if child is not None and child.poll() is None:
            child.kill()  # a round killed half-way is safe (see the module docstring)
        if self._thread.is_alive():
            self._thread.join(timeout)
