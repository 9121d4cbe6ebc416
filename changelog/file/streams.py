"""File-log streams: the file changelog format (:mod:`localstate.changelog.file`) used as job input
and output. ``<path>/<stream>/<partition>/*.log``; keys and values encoded with serdes (JSON by
default). Outputs truncate their partition on rollback (exactly-once outputs)."""

from __future__ import annotations

import fcntl
import os
import stat
from pathlib import Path
from typing import Any, ClassVar, Iterator, Mapping

from localstate.core.filewatch import FileWatch, WatchedFiles, wait_for_files
from localstate.core.fsutil import fsync_dir, open_nofollow
from localstate.core.config import JobConfig, StreamConfig
from localstate.core.options import Option, parse_path, parse_size
from localstate.errors import ChangelogCorruptError, InputError, InvalidNameError, OutputError, SerdeError, \
    UnsafePathError

from localstate.core.routing import ROUTING_OPTIONS
from localstate.core.stream import (BadTimestamp, FileIdentities, InputColumns, InputRecord, InputStream,
                                          OutputStream, StreamSystem, check_regular_file, columns_of, resolve_path)

from localstate.changelog.framing import HEADER, HEADER_SIZE, find_valid_after, walk
from .format import list_segments, segment_name
from .partition import DEFAULT_SEGMENT_BYTES, LOCK_FILE, FileChangelogPartition
from .system import FileChangelogSystem

__all__ = ["FileLogStreams", "FileLogInput", "FileLogOutput", "truncate_log"]

_DAMAGED_HINT = ("the input's segment file is damaged (disk error or manual edit): restore it from a backup or "
                 "from its producer; a damaged frame cannot be skipped or dead-lettered, because how many "
                 "records it held is unknown")

_SERDE_OPTIONS: Mapping[str, Option] = {
    "path": Option(str, parse=parse_path, doc="root directory of the file streams (relative to the job file)"),
    "stream": Option(str, default="", doc="stream name under path (default: the input/output name)"),
    "key_serde": Option(str, default="json", doc="serde of keys"),
    "value_serde": Option(str, default="json", doc="serde of values"),
}


def truncate_log(directory: Path, offset: int) -> None:
    """Drop every record with offset >= ``offset`` from a file-log partition directory. The caller
    holds the partition's writer lock (no writer object may be open on it)."""
    bases = list_segments(directory)
    for base in reversed(bases):
        path = directory / segment_name(base)
        if base >= offset and base != bases[0]:
            path.unlink()
            continue
        with os.fdopen(open_nofollow(path, os.O_RDWR), "r+b") as handle:
            data = handle.read()
            pos = 0
            while pos + HEADER_SIZE <= len(data):
                _crc, off, _ts, klen, vlen = HEADER.unpack_from(data, pos)
                if off >= offset:
                    break
                pos += HEADER_SIZE + klen + max(vlen, 0)
            if pos < len(data):
                handle.truncate(pos)
                handle.flush()
                os.fsync(handle.fileno())
        break
    fsync_dir(directory)


class _FileLog:
    def _setup(self, job: JobConfig, name: str) -> None:
        self.root = resolve_path(job, self.config["path"])
        self.stream = self.config["stream"] or name
        segment_bytes = self.config.get("segment_bytes")
        self.system = FileChangelogSystem({"path": str(self.root), "fsync": True,
                                           **({"segment_bytes": segment_bytes} if segment_bytes else {})},
                                          job.state_dir)
        registry = job.registry
        self.key_serde = registry.serde(self.config["key_serde"], allow_pickle=job.allow_pickle)
        self.value_serde = registry.serde(self.config["value_serde"], allow_pickle=job.allow_pickle)

    def location(self) -> tuple[str, str]:
        return "path", str((self.root / self.stream).resolve())


class FileLogInput(WatchedFiles, _FileLog, InputStream):
    system = "file"
    options: ClassVar[Mapping[str, Option]] = {
        **_SERDE_OPTIONS,
        "ts_field": Option(str, default="ts", doc="value field holding the event time, in timestamp_unit (when values "
                                                  "are objects)"),
        **ROUTING_OPTIONS,
    }

    def __init__(self, job: JobConfig, config: StreamConfig) -> None:
        super().__init__(job, config)
        self._setup(job, config.name)
        self._tails: dict[int, tuple[int, int, int, int]] = {}
        """partition -> (last segment base, inode, byte position and offset after its valid records)"""
        self._identities = FileIdentities()
        self._watch = FileWatch(self.name)

    def wait_for_records(self, positions: dict[int, int], timeout: float) -> bool:
        """See :class:`~localstate.core.stream.WaitableInput`: sleeps until a segment of a partition
        of ``positions`` is written or created (or the partition's directory), then checks with
        :meth:`end_offset` that a complete record lies at or past its position."""
        stream_dir = self.input_directory()
        wanted = {str(int(partition)) for partition in positions}
        directories = [(stream_dir, True)] + [(stream_dir / p, False) for p in sorted(wanted)]
        return wait_for_files(self._watch, directories,
                              lambda directory, name: directory != stream_dir or name in wanted,
                              lambda: any(self.end_offset(p) > at for p, at in positions.items()), timeout)

    def identity(self, partition: int, recorded: str | None = None) -> str | None:
        """The partition's first segment file: device, inode and a fingerprint of its first bytes
        (:class:`~localstate.core.stream.IdentifiedInput`): a partition replaced under the job
        is refused, one appended to is not."""
        if not self._check_partition(partition):
            return None
        directory = self.system.partition_dir(self.stream, partition)
        segments = [(base, directory / segment_name(base)) for base in list_segments(directory)]
        return self._identities.identity(segments, recorded, stream=self.name, partition=partition)

    def input_directory(self) -> Path:
        return self.root / self.stream

    def _check_partition(self, partition: int) -> bool:
        """Whether the partition exists; its directory must be a directory and its segments regular
        files (InputError naming the path otherwise: a FIFO would hang the reader, a device never ends)."""
        try:
            directory = self.system.partition_dir(self.stream, partition)
        except (InvalidNameError, UnsafePathError) as exc:  # e.g. a symlink to /dev/zero
            path = self.root / self.stream / str(partition)
            raise InputError(f"input partition {path} resolves outside the input path {self.root}",
                             stream=self.name, partition=partition, path=str(path),
                             hint="input partitions must be directories inside the input's path; replace "
                                  "the symlink with the partition's directory") from exc
        try:
            info = os.stat(directory)
        except FileNotFoundError:
            return False
        except OSError as exc:
            raise InputError(f"cannot access input partition {directory}: {exc.strerror or exc}", stream=self.name,
                             partition=partition, path=str(directory),
                             hint="check the input path and the job user's permissions on it") from exc
        if not stat.S_ISDIR(info.st_mode):
            raise InputError(f"input partition {directory} is not a directory", stream=self.name,
                             partition=partition, path=str(directory),
                             hint="a file-log partition is a directory of .log segments; fix the input's path")
        for base in list_segments(directory):
            check_regular_file(directory / segment_name(base), stream=self.name, partition=partition)
        return True

    def end_offset(self, partition: int) -> int:
        """The offset after the last valid record of the last segment. A record that fails its check
        with valid records after it is damage, not the end of the data: an InputError (never a
        silent stop that would leave every later record unread, on every run)."""
        return self._scan_end(partition)[0]

    def pending_bytes(self, partition: int) -> int:
        """Bytes of an incomplete last record (an append in progress, or a writer that stopped
        mid-record; :class:`~localstate.core.stream.PendingTail`): not read until complete."""
        return self._scan_end(partition)[1]

    def pending_since(self, partition: int) -> float | None:
        """The last segment's modification time while it ends in an incomplete record, else None."""
        _end, pending, mtime = self._scan_end(partition)
        return mtime if pending else None

    def _scan_end(self, partition: int) -> tuple[int, int, float]:
        """``(end offset, bytes after the last valid record, last segment's mtime)`` of ``partition``
        (see :meth:`end_offset`); zeros when it does not exist."""
        if not self._check_partition(partition):
            return 0, 0, 0.0
        directory = self.system.partition_dir(self.stream, partition)
        while True:
            bases = list_segments(directory)
            if not bases:
                return 0, 0, 0.0
            base = bases[-1]
            path = directory / segment_name(base)
            try:
                with open(path, "rb") as handle:
                    stat = os.fstat(handle.fileno())
                    # Continue where the previous call stopped while the last segment is the same file
                    # (an input only grows): each batch reads only the bytes appended since.
                    seen = self._tails.get(partition)
                    pos, expected = 0, base
                    if seen is not None and seen[:2] == (base, stat.st_ino) and seen[2] <= stat.st_size:
                        pos, expected = seen[2], seen[3]
                        handle.seek(pos)
                    data = handle.read()
            except FileNotFoundError:
                continue  # the last segment was replaced meanwhile: list again
            valid_end, next_offset, bad = walk(data, 0, expected)
            if bad is not None and find_valid_after(data, bad, next_offset) is not None:
                if pos:
                    # Maybe not damage but another file under the same inode (truncated and written
                    # again): the remembered position means nothing in it. Scan it from its start once.
                    del self._tails[partition]
                    continue
                raise InputError(f"input {self.name!r} partition {partition}: the record at offset {next_offset} of "
                                 f"segment {path} is damaged and valid records follow it",
                                 stream=self.name, partition=partition, offset=next_offset, segment=str(path),
                                 byte=pos + bad, hint=_DAMAGED_HINT)
            self._tails[partition] = (base, stat.st_ino, pos + valid_end, next_offset)
            return next_offset, len(data) - valid_end, stat.st_mtime

    def read(self, partition: int, start: int, end: int) -> Iterator[InputRecord]:
        if start >= end:
            return
        try:
            yield from self._read(partition, start, end)
        except ChangelogCorruptError as exc:
            raise InputError(f"input {self.name!r} partition {partition}: {exc.message}", stream=self.name,
                             partition=partition, offset=exc.context.get("offset"),
                             segment=exc.context.get("segment"), byte=exc.context.get("byte"),
                             hint=_DAMAGED_HINT) from exc

    def read_columns(self, partition: int, start: int, end: int) -> Iterator[InputColumns]:
        """:meth:`read` as :class:`~localstate.core.stream.InputColumns` chunks (a batch task's
        input): each record decoded by the stream's serdes as for :meth:`read`, no record tuple per
        decodable row."""
        return columns_of(self.read(partition, start, end))

    def _read(self, partition: int, start: int, end: int) -> Iterator[InputRecord]:
        self._check_partition(partition)
        reader = self.system.reader(self.stream, partition)
        key_de, value_de, ts_field = self.key_serde.deserialize, self.value_serde.deserialize, self.config["ts_field"]
        seconds = self.timestamps.seconds
        try:
            for record in reader.read(start, end):
                try:
                    key = key_de(record.key)
                    value = value_de(record.value) if record.value is not None else None
                except SerdeError as exc:
                    yield InputRecord(record.offset, None, None, None, f"undecodable: {exc.message}",
                                      repr((record.key, record.value))[:1000])
                    continue
                try:
                    ts = seconds(value.get(ts_field)) if isinstance(value, dict) else None
                except BadTimestamp as exc:
                    yield InputRecord(record.offset, None, None, None, exc.problem,
                                      repr((record.key, record.value))[:1000])
                    continue
                yield InputRecord(record.offset, key, value, ts)
        finally:
            reader.close()


class FileLogOutput(_FileLog, OutputStream):
    system = "file"
    options: ClassVar[Mapping[str, Option]] = {
        **_SERDE_OPTIONS,
        "segment_bytes": Option((int, str), default=DEFAULT_SEGMENT_BYTES, parse=parse_size, minimum=1,
                                doc="roll a partition to a new segment file once its active one holds this many "
                                    "bytes ('64MiB'); segments are never deleted (rollback truncates the one holding "
                                    "the checkpoint's offset and deletes the later ones)"),
    }

    def __init__(self, job: JobConfig, config: StreamConfig) -> None:
        super().__init__(job, config)
        self._setup(job, config.name)
        self._writers: dict[int, FileChangelogPartition] = {}

    def _ensure(self, partition: int) -> None:
        self.system.ensure_stream(self.stream, self.job.partitions)

    def _writer(self, partition: int) -> FileChangelogPartition:
        writer = self._writers.get(partition)
        if writer is None:
            self._ensure(partition)
            writer = self._writers[partition] = self.system.partition(self.stream, partition)
        return writer

    def end_offset(self, partition: int) -> int:
        return self._writer(partition).flush()

    def truncate(self, partition: int, position: int) -> int:
        writer = self._writer(partition)
        end = writer.flush()
        if end < position:
            directory = self.system.partition_dir(self.stream, partition)
            bases = list_segments(directory)
            if len(bases) > 1:  # a rolled output holds less than the checkpoint names: damaged by hand
                last = directory / segment_name(bases[-1])
                raise OutputError(f"output segment {last} ends at offset {end}, but the checkpoint names offset "
                                  f"{position}: a segment was truncated or deleted by hand", stream=self.name,
                                  partition=partition, path=str(last), offset=end,
                                  hint="restore the segments from a backup; localstate only deletes or truncates "
                                       "output segments written after the last checkpoint (rollback)")
        if end > position:
            # Truncate under the writer's lock, then reopen so its in-memory end is re-read.
            directory = self.system.partition_dir(self.stream, partition)
            lock = open_nofollow(directory / LOCK_FILE, os.O_RDWR)
            try:
                writer.close()
                self._writers.pop(partition, None)
                fcntl.flock(lock, fcntl.LOCK_EX)
                truncate_log(directory, position)
            finally:
                os.close(lock)
            writer = self._writer(partition)
        return writer.flush()

    def append(self, partition: int, items: list[tuple[Any, Any]]) -> int:
        writer = self._writer(partition)
        if items:
            key_ser, value_ser = self.key_serde.serialize, self.value_serde.serialize
            writer.append_many((key_ser(k), value_ser(v) if v is not None else None) for k, v in items)
        return writer.flush()

    def read(self, partition: int) -> Iterator[tuple[Any, Any]]:
        if not self.system.partition_dir(self.stream, partition).exists():
            return
        reader = self.system.reader(self.stream, partition)
        try:
            for record in reader.read(0):
                yield (self.key_serde.deserialize(record.key),
                       self.value_serde.deserialize(record.value) if record.value is not None else None)
        finally:
            reader.close()

    def close(self) -> None:
        for writer in self._writers.values():
            writer.close()
        self._writers.clear()


class FileLogStreams(StreamSystem):
    """``file``: streams in the file changelog format, with exactly-once (truncating) outputs."""

    description = "streams in the file changelog format"
    input = FileLogInput
    output = FileLogOutput
