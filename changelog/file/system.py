"""The file changelog system: streams are directories, partitions are directories of segment files.

Layout::

    <path>/<stream>/stream.json                      {"format": 1, "partitions": N}
    <path>/<stream>/<partition>/00000000000000000000.log   segments named by base offset
    <path>/<stream>/<partition>/writer.lock          flock'ed by the single writer
    <path>/<stream>/<partition>/compact.lock         flock'ed while compacting
    <path>/<stream>/<partition>/compaction.json      what compaction removed (gaps, tombstone horizon)
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
from pathlib import Path
from typing import Any, Callable, ClassVar, Mapping

from localstate.core.changelog import ChangelogSystem
from localstate.core.names import check_name, safe_join
from localstate.core.options import Option, parse_duration, parse_size
from localstate.errors import ChangelogCorruptError, ChangelogError, ConfigError

from .compaction import BackgroundCompactor, CompactionStats, compact_partition, compact_stream
from .format import list_segments, segment_name
from .partition import DEFAULT_SEGMENT_BYTES, LOCK_FILE, FileChangelogPartition
from localstate.core.fsutil import make_owned_dir, open_nofollow, read_nofollow, write_atomic

__all__ = ["FileChangelogSystem", "STREAM_META", "DEFAULT_COMPACT_INTERVAL"]

log = logging.getLogger(__name__)

STREAM_META = "stream.json"
#: Default period of background compaction in ``localstate run`` (seconds): frequent enough that a
#: long-running job's changelog stays near its live size, rare enough that the rewrite cost is small.
DEFAULT_COMPACT_INTERVAL = 600.0
FORMAT_VERSION = 1


def _inside_when_relative(value: str) -> str:
    """A relative changelog path must stay inside the state directory (``reset`` deletes there)."""
    if not Path(value).is_absolute() and ".." in Path(value).parts:
        raise ValueError(f"relative path {value!r} leaves the state directory; use a path inside it, "
                         "or an absolute path for changelogs kept elsewhere")
    return value


class FileChangelogSystem(ChangelogSystem):
    """Embedded, durable changelog on the local file system (the default)."""

    description = "changelog segments in local files (embedded default, durable with fsync)"
    options: ClassVar[Mapping[str, Option]] = {
        "path": Option(str, default="changelogs", parse=_inside_when_relative,
                       doc="directory of the changelogs; relative paths are relative to the state dir "
                           "and must stay inside it"),
        "segment_bytes": Option((int, str), default=DEFAULT_SEGMENT_BYTES, parse=parse_size, minimum=1,
                                doc="roll to a new segment file once a segment reaches this size ('64MB')"),
        "fsync": Option(bool, default=True, doc="fsync segment files at every flush"),
        "tombstone_retention": Option((int, float, str), default=86400.0, parse=parse_duration,
                                      doc="compaction keeps tombstones at least this long ('1d')"),
        "compact_interval": Option((int, float, str), default=DEFAULT_COMPACT_INTERVAL, parse=parse_duration,
                                   doc="period of compaction while a job runs ('10m'); 0 disables it"),
    }

    def __init__(self, options: Mapping[str, Any] | None = None, state_dir: Path | str = ".") -> None:
        validated = self.validate(dict(options or {}), "changelog")
        super().__init__(validated, Path(state_dir))
        path = Path(validated["path"])
        self.root = path if path.is_absolute() else self.state_dir / path
        # Below the anchor nothing is followed through a symlink: the state dir for a relative path
        # (its `changelogs` dir included), else the operator's chosen directory.
        self.anchor = self.root if path.is_absolute() else self.state_dir
        self.segment_bytes: int = validated["segment_bytes"]
        self.fsync: bool = validated["fsync"]
        self.tombstone_retention: float = validated["tombstone_retention"]
        self.compact_interval: float = validated["compact_interval"]
        self._compactor: BackgroundCompactor | None = None

    # ---------------------------------------------------------------- paths

    def stream_dir(self, stream: str) -> Path:
        """Directory of ``stream`` (validated: it cannot escape ``root``)."""
        check_name(stream, "stream", "changelog.stream")
        return safe_join(self.root, stream, anchor=self.anchor)

    def partition_dir(self, stream: str, partition: int) -> Path:
        if isinstance(partition, bool) or not isinstance(partition, int) or partition < 0:
            raise ChangelogError(f"invalid partition {partition!r}", stream=stream,
                                 hint="partitions are integers >= 0")
        self.stream_dir(stream)
        return safe_join(self.root, stream, str(partition), anchor=self.anchor)

    def _check_partition_count(self, stream: str, partition: int) -> None:
        meta = self._read_meta(stream)
        if meta is not None and partition >= meta["partitions"]:
            raise ChangelogError(f"partition {partition} does not exist: the stream has {meta['partitions']}",
                                 stream=stream, partition=partition,
                                 hint="use a partition number below the stream's partition count")

    def _read_meta(self, stream: str) -> dict[str, Any] | None:
        path = self.stream_dir(stream) / STREAM_META
        try:
            meta = json.loads(read_nofollow(path))
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            raise ChangelogError(f"unreadable stream metadata: {exc}", stream=stream, path=str(path),
                                 hint="fix or remove the file (it only records the partition count)") from exc
        if not isinstance(meta, dict) or not isinstance(meta.get("partitions"), int):
            raise ChangelogError("malformed stream metadata", stream=stream, path=str(path),
                                 hint='it must be JSON like {"format": 1, "partitions": 4}')
        return meta

    # ---------------------------------------------------------------- API

    def ensure_stream(self, stream: str, partitions: int) -> None:
        """Create the stream with ``partitions`` partitions, or check the recorded count matches."""
        if isinstance(partitions, bool) or not isinstance(partitions, int) or partitions < 1:
            raise ConfigError.at("changelog.partitions", f"must be an integer >= 1, got {partitions!r}")
        meta = self._read_meta(stream)
        if meta is not None:
            if meta["partitions"] != partitions:
                raise ChangelogError(
                    f"changelog stream has {meta['partitions']} partitions but the job uses {partitions}",
                    stream=stream, path=str(self.stream_dir(stream)),
                    hint="the partition count of a job cannot change (state is partitioned by it): restore "
                         "the previous count, or start with a new job name / empty state directory")
            return
        directory = make_owned_dir(self.anchor, self.stream_dir(stream), "changelog-stream", stream=stream,
                                   layout=lambda entry: entry == STREAM_META or entry.isdigit()
                                   or entry.startswith(STREAM_META + "."))
        write_atomic(directory / STREAM_META,
                     json.dumps({"format": FORMAT_VERSION, "partitions": partitions}).encode())

    def partition(self, stream: str, partition: int) -> FileChangelogPartition:
        """Open one partition for appending and reading (takes the partition's writer lock)."""
        directory = self.partition_dir(stream, partition)
        self._check_partition_count(stream, partition)
        return FileChangelogPartition(directory, stream, partition, writable=True,
                                      segment_bytes=self.segment_bytes, fsync=self.fsync)

    def reader(self, stream: str, partition: int) -> FileChangelogPartition:
        """Open one partition read-only, without a lock (may run next to the writer, in any process)."""
        directory = self.partition_dir(stream, partition)
        return FileChangelogPartition(directory, stream, partition, writable=False,
                                      segment_bytes=self.segment_bytes, fsync=self.fsync)

    def compact(self, stream: str, partition: int, upto: int, now: float | None = None, *,
                roll: bool = True) -> CompactionStats:
        """Keep the last record per key below ``upto`` (see compaction.compact_partition).

        ``roll``: if the active segment holds records below ``upto`` and no writer has the partition
        open, seal it first so those records are compacted too (a live writer keeps its segment; it
        rolls when its runtime asks it to)."""
        if roll:
            self.roll_if_idle(stream, partition, upto)
        return compact_partition(self.partition_dir(stream, partition), upto,
                                 tombstone_retention=self.tombstone_retention, now=now, fsync=self.fsync,
                                 stream=stream, partition=partition)

    def roll_if_idle(self, stream: str, partition: int, upto: int) -> bool:
        """Seal the active segment of a partition nobody writes to if it holds records below ``upto``.
        Returns True if it did; False if there is nothing to roll or a writer holds the partition."""
        directory = self.partition_dir(stream, partition)
        bases = list_segments(directory)
        if not bases or bases[-1] >= upto:
            return False
        lock_fd = open_nofollow(directory / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log.info("changelog %s partition %d: a writer holds the active segment; compacting sealed "
                     "segments only", stream, partition)
            return False
        finally:
            os.close(lock_fd)  # a probe only: the writer opened below takes the lock itself
        try:
            writer = FileChangelogPartition(directory, stream, partition, writable=True,
                                            segment_bytes=self.segment_bytes, fsync=self.fsync)
        except ChangelogCorruptError:
            raise
        except ChangelogError:  # a writer started between the probe and now
            return False
        with writer:
            return writer.roll()

    def segments(self, stream: str, partition: int) -> list[tuple[str, int]]:
        """``(file name, bytes)`` of each segment of a partition, oldest first (``localstate inspect``)."""
        directory = self.partition_dir(stream, partition)
        return [(segment_name(base), (directory / segment_name(base)).stat().st_size)
                for base in list_segments(directory)]

    def stream_location(self, stream: str) -> tuple[str, str]:
        """``("path", <absolute stream directory>)``: where outputs must never write."""
        return "path", os.path.abspath(self.root / stream)

    def compact_stream(self, stream: str, upto_by_partition: Mapping[int, int],
                       now: float | None = None) -> CompactionStats:
        """Compact every listed partition of ``stream`` (see compaction.compact_stream)."""
        return compact_stream(self, stream, upto_by_partition, now=now)

    def compaction_rounds(self, targets: Callable[[], Mapping[tuple[str, int], int]]) -> BackgroundCompactor:
        """An unstarted compactor whose ``run_once()`` compacts ``targets()`` once, never sealing an
        active segment (the caller's writers roll)."""
        return BackgroundCompactor(self, self.compact_interval, targets)

    def start_compactor(self, targets: Callable[[], Mapping[tuple[str, int], int]]) -> BackgroundCompactor:
        """Start background compaction every ``compact_interval`` seconds; ``targets()`` returns
        ``{(stream, partition): upto}``. Stopped by :meth:`close`."""
        if self.compact_interval <= 0:
            raise ChangelogError("background compaction is disabled", hint="set changelog option "
                                 "compact_interval (e.g. '10m') or call compact() / compact_stream()")
        if self._compactor is not None:
            raise ChangelogError("background compactor already running", hint="call close() first")
        self._compactor = BackgroundCompactor(self, self.compact_interval, targets).start()
        return self._compactor

    def close(self) -> None:
        if self._compactor is not None:
            self._compactor.stop()
            self._compactor = None
