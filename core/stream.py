"""The stream-system contract: inputs read by offset range, outputs written durably with rollback.

An input stream partition is a log: records at consecutive offsets ``0..end_offset()``. Job
partition ``p`` reads input partition ``p`` (Samza's model: inputs are pre-partitioned with the
Kafka-compatible partitioner of :mod:`localstate.core.partitioner`). A record that cannot be
decoded is yielded as an :class:`InputRecord` with ``error`` set, so the runtime can apply the
input's ``on_error`` policy (``fail`` | ``skip`` | ``dead_letter``).
"""

from __future__ import annotations

import hashlib
import os
import stat
from abc import ABC, abstractmethod
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, ClassVar, Iterator, Mapping, NamedTuple, Protocol, Sequence, \
    runtime_checkable

from localstate.core.changelog import PLUGIN_API_VERSION
from localstate.core.event_time import (NO_BOUNDS, TIMESTAMP_OPTIONS, BadTimestamp, RecordProblem,
                                                TimestampRule, timestamp_rule)
from localstate.core.options import Option, did_you_mean, validate_options
from localstate.core.policy import job_folder
from localstate.errors import ConfigError, ConfigProblem, InputError, InputPositionError, LocalStateError, OutputError, \
    PluginNotFoundError

if TYPE_CHECKING:
    from localstate.core.config import JobConfig, StreamConfig

__all__ = ["InputRecord", "InputStream", "OutputStream", "StreamSystem", "DirectoryInput", "ON_ERROR", "base_dir",
           "resolve_path", "overlap_problems", "places_overlap", "open_input", "open_output", "check_regular_file",
           "open_regular_file", "check_output_file", "PendingTail", "RetainedStart", "IdentifiedInput",
           "PENDING_TAIL_WARN_AFTER", "check_input_position", "same_stream", "FileIdentities", "IDENTITY_BYTES", "seek_hint",
           "InputColumns", "ColumnarInput", "columns_of", "COLUMN_ROWS", "TimestampRule", "BadTimestamp",
           "RecordProblem", "NO_BOUNDS", "timestamp_rule", "WaitableInput", "FollowedInput", "follow_end"]

ON_ERROR = ("fail", "skip", "dead_letter")

#: Options every input accepts, whatever its system.
COMMON_INPUT_OPTIONS: Mapping[str, Option] = {
    "on_error": Option(str, default="fail", choices=ON_ERROR,
                       doc="bad record (undecodable, no key, a timestamp that is no plausible event time): fail "
                           "the job, skip it (counted), or write it to the `dead_letter` output stream"),
    "dead_letter": Option(str, default="", doc="output stream receiving bad records when on_error = 'dead_letter'"),
    **TIMESTAMP_OPTIONS,
}


#: Options every output accepts, whatever its system.
COMMON_OUTPUT_OPTIONS: Mapping[str, Option] = {
    "overwrite": Option(bool, default=False,
                        doc="at a first start, replace data already in the output that no checkpoint of this "
                            "job covers (default: refuse to start, so nothing the job did not write is lost)"),
}


class InputRecord(NamedTuple):
    """One record read from an input partition. ``error`` is set when it could not be decoded;
    ``raw`` then holds what was read (for the dead-letter stream).

    A NamedTuple rather than a frozen dataclass: it is built once per input record, and tuple
    construction costs less than half of a frozen dataclass's ``__init__``."""

    offset: int
    key: Any
    value: Any
    ts: float | None = None
    error: str | None = None
    raw: str | None = None


COLUMN_ROWS = 4096
"""Rows per :class:`InputColumns` chunk a :class:`ColumnarInput` yields (at most)."""


class InputColumns(NamedTuple):
    """Consecutive records of one input partition as columns, for a batch task: the decodable rows
    as parallel columns (``offsets`` a list or a range, ascending; ``keys``, ``values`` and ``timestamps`` lists,
    or pyarrow arrays holding exactly those values, ``timestamps`` as float64), and the undecodable or
    keyless ones as
    :class:`InputRecord` with ``error`` set, in ``bad``. ``end`` is the offset after the last row of
    either kind (what the input's position becomes once the chunk is fed)."""

    offsets: Sequence[int]
    keys: list[Any]
    values: list[Any]
    timestamps: list[float | None]
    bad: list[InputRecord]
    end: int

    @property
    def rows(self) -> int:
        """Rows of either kind."""
        return len(self.offsets) + len(self.bad)


@runtime_checkable
class ColumnarInput(Protocol):
    """An optional capability of an :class:`InputStream`: its records as :class:`InputColumns`
    chunks, for a batch task (no :class:`InputRecord` per decodable row). Chunks hold exactly the
    rows :meth:`InputStream.read` yields, with the same values, errors and raw text, in order."""

    def read_columns(self, partition: int, start: int, end: int) -> Iterator[InputColumns]:
        """The records ``start <= offset < end`` as chunks of at most :data:`COLUMN_ROWS` rows."""


def columns_of(records: Iterator[InputRecord], rows: int = COLUMN_ROWS) -> Iterator[InputColumns]:
    """``records`` grouped into :class:`InputColumns` chunks of at most ``rows`` rows (how an input
    whose decoding is per record, a serde's, offers :class:`ColumnarInput`)."""
    offsets: list[int] = []
    keys: list[Any] = []
    values: list[Any] = []
    times: list[float | None] = []
    bad: list[InputRecord] = []
    end = None
    for record in records:
        if record.error is None:
            offsets.append(record.offset)
            keys.append(record.key)
            values.append(record.value)
            times.append(record.ts)
        else:
            bad.append(record)
        end = record.offset + 1
        if len(offsets) + len(bad) >= rows:
            yield InputColumns(offsets, keys, values, times, bad, end)
            offsets, keys, values, times, bad = [], [], [], [], []
    if end is not None and (offsets or bad):
        yield InputColumns(offsets, keys, values, times, bad, end)


def base_dir(job: JobConfig) -> Path:
    """The directory relative paths in a job file are relative to: the job's folder, the one rule of
    :func:`~localstate.core.policy.job_folder` (a symlinked job file: the link's folder)."""
    if job.base_dir is not None:
        return job.base_dir
    return job_folder(job.source) if job.source else Path.cwd()


def resolve_path(job: JobConfig, value: str) -> Path:
    path = Path(value)
    return path if path.is_absolute() else base_dir(job) / path


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


def _not_regular(path: Path, mode: int, stream: str, partition: int) -> InputError:
    return InputError(f"input partition {path} is {_kind(mode)}, not a regular file", stream=stream,
                      partition=partition, path=str(path),
                      hint="input partitions must be regular files (a symlink to one is fine); replace it "
                           "with a regular file or fix the input's path")


def check_regular_file(path: Path, *, stream: str, partition: int) -> os.stat_result | None:
    """``os.stat`` of an input partition file (symlinks followed), None when it does not exist.
    Anything but a regular file (FIFO, device such as ``/dev/zero``, directory, socket) raises
    InputError naming the path *before* it is opened: opening a FIFO blocks, reading a device never
    ends, and opening some devices has side effects."""
    try:
        info = os.stat(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise InputError(f"cannot access input partition {path}: {exc.strerror or exc}", stream=stream,
                         partition=partition, path=str(path),
                         hint="check the input path and the job user's permissions on it") from exc
    if not stat.S_ISREG(info.st_mode):
        raise _not_regular(path, info.st_mode, stream, partition)
    return info


def open_regular_file(path: Path, *, stream: str, partition: int) -> BinaryIO | None:
    """Open an input partition file for binary reading, None when it does not exist. Checked with
    :func:`check_regular_file` first, then opened non-blocking (a FIFO swapped in after the check
    cannot hang the open) and checked again on the open descriptor."""
    if check_regular_file(path, stream=stream, partition=partition) is None:
        return None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise InputError(f"cannot open input partition {path}: {exc.strerror or exc}", stream=stream,
                         partition=partition, path=str(path),
                         hint="check the input path and the job user's permissions on it") from exc
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise _not_regular(path, mode, stream, partition)
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def check_output_file(path: Path, *, stream: str, partition: int) -> bool:
    """Whether an output partition file exists; if it does, it must be a regular file (OutputError
    naming the path otherwise): appending to a FIFO blocks, and counting the lines of a device such
    as ``/dev/zero`` never ends."""
    try:
        info = os.stat(path)
    except FileNotFoundError:
        return False
    except OSError:
        return True  # let the open report it, typed with its errno
    if not stat.S_ISREG(info.st_mode):
        raise OutputError(f"output partition {path} is {_kind(info.st_mode)}, not a regular file", stream=stream,
                          partition=partition, path=str(path),
                          hint="remove it (localstate creates the file) or point the output's path elsewhere")
    return True


class InputStream(ABC):
    """One configured input (all its partitions). Instances are cheap; create one per use."""

    system: ClassVar[str]
    options: ClassVar[Mapping[str, Option]] = {}

    def __init__(self, job: JobConfig, config: StreamConfig) -> None:
        self.job = job
        self.name = config.name
        spec = {**COMMON_INPUT_OPTIONS, **self.options}
        self.config = validate_options(spec, dict(config.options), f"inputs.{config.name}")
        self.on_error: str = self.config["on_error"]
        self.dead_letter: str = self.config["dead_letter"]
        self.on_misrouted: str | None = self.config.get("on_misrouted")
        """what to do with a record in another partition than its key's (:mod:`.routing`); None: the
        input does not place its records by key (not checked)"""
        for policy in ("on_error", "on_misrouted"):
            if self.config.get(policy) == "dead_letter" and self.dead_letter not in job.outputs:
                raise ConfigError.at(f"inputs.{self.name}.dead_letter",
                                     f"{policy} = 'dead_letter' needs an output stream; got {self.dead_letter!r}",
                                     hint="declare [outputs.<name>] and set dead_letter = '<name>'")
        if self.on_misrouted == "route":
            raise ConfigError.at(f"inputs.{self.name}.on_misrouted",
                                 "on_misrouted = 'route' needs a runtime that can send a record to the task partition "
                                 "of its key; `localstate run` reads each input partition in that partition's own "
                                 "task (only the TaskTestDriver routes)",
                                 hint="use 'fail' (the default), 'skip' or 'dead_letter', or re-partition the input "
                                      "by key (docs/task-api.md, \"Input partitioning\")")
        self.timestamps: TimestampRule = timestamp_rule(self.name, self.config)
        """how the records' timestamps become event time (``timestamp_unit``, ``min_timestamp``,
        ``max_timestamp``): every reader passes each timestamp through it, a bad one makes a bad record"""

    @abstractmethod
    def end_offset(self, partition: int) -> int:
        """Offset after the last complete record of ``partition``."""

    def location(self) -> tuple[str, str] | None:
        """Where the stream's data lives, to detect an output writing over an input:
        ``("path", <absolute directory>)`` or ``("kafka", <topic>)``; None when it has no place."""
        return None

    @abstractmethod
    def read(self, partition: int, start: int, end: int) -> Iterator[InputRecord]:
        """Records with ``start <= offset < end``, in offset order."""


class OutputStream(ABC):
    """One configured output, written by one task partition into its own partition ``p``.

    File and JSON-lines outputs are written per producing task partition (one writer per file),
    which is what makes :meth:`truncate` (exactly-once outputs) possible."""

    system: ClassVar[str]
    options: ClassVar[Mapping[str, Option]] = {}
    exactly_once: ClassVar[bool] = True
    """Whether :meth:`truncate` really drops records written after a checkpoint (exactly-once
    outputs). False (Kafka): outputs are at-least-once across a crash between their flush and the
    checkpoint; state stays exactly-once either way."""

    def __init__(self, job: JobConfig, config: StreamConfig) -> None:
        self.job = job
        self.name = config.name
        self.config = validate_options({**COMMON_OUTPUT_OPTIONS, **self.options}, dict(config.options),
                                       f"outputs.{config.name}")
        self.overwrite: bool = self.config["overwrite"]

    @abstractmethod
    def truncate(self, partition: int, position: int) -> int:
        """Drop every record at or after ``position``; return the resulting end position."""

    @abstractmethod
    def append(self, partition: int, items: list[tuple[Any, Any]]) -> int:
        """Append ``(key, value)`` pairs durably; return the end position."""

    @abstractmethod
    def end_offset(self, partition: int) -> int:
        """Current end position of ``partition``."""

    def read(self, partition: int) -> Iterator[tuple[Any, Any]]:
        """Every record of ``partition`` as ``(key, value)`` (tests, verification)."""
        raise NotImplementedError

    def location(self) -> tuple[str, str] | None:
        """Where the output writes (see :meth:`InputStream.location`)."""
        return None

    def close(self) -> None:
        """Release writers."""


@runtime_checkable
class DirectoryInput(Protocol):
    """An input reading one local directory. The directory must exist before a job runs: a mistyped
    path would otherwise run as an empty input and report success."""

    def input_directory(self) -> Path:
        """The directory the input reads (absolute, or relative to the working directory)."""


#: Seconds an unterminated tail (see :class:`PendingTail`) may stay unchanged before ``localstate run``
#: logs a WARNING naming the input, partition and byte count. Shorter: an append in progress.
PENDING_TAIL_WARN_AFTER = 30.0


@runtime_checkable
class PendingTail(Protocol):
    """An input whose last record can be caught half-written: a file being appended to (``jsonl``:
    a last line without its newline; ``file``: an incomplete last record). Those bytes are an append
    still in progress and are not read yet (:meth:`InputStream.end_offset` stops before them), but
    they are counted, so that a run can show them next to its lag and warn when they stay
    incomplete (a writer that stopped mid-record). Optional: inputs that cannot have such a tail do
    not implement it."""

    def pending_bytes(self, partition: int) -> int:
        """Bytes after the last complete record of ``partition`` (0: none, or no such partition)."""

    def pending_since(self, partition: int) -> float | None:
        """When those bytes last changed (epoch seconds: the file's modification time); None when
        there are none."""


@runtime_checkable
class RetainedStart(Protocol):
    """An input that may delete its oldest records under a job (Kafka: retention, DeleteRecords): the
    first offset it still holds. Optional: an input that never deletes records starts at 0."""

    def start_offset(self, partition: int) -> int:
        """Offset of the first record ``partition`` still holds (its log start offset)."""


@runtime_checkable
class IdentifiedInput(Protocol):
    """An input whose name may come to mean another stream: a Kafka topic deleted and created again
    under the same name starts its offsets over; a file input's partition file renamed over, or
    truncated and written again, is another file under the same path. Optional: an input without it
    is taken to be the one its checkpointed positions were read from."""

    def identity(self, partition: int, recorded: str | None = None) -> str | None:
        """The identity of what ``partition`` of the input reads now (a Kafka topic's id; a file
        partition's :class:`FileIdentities`), in the form of ``recorded`` (an identity the checkpoint
        recorded earlier: a file's fingerprints as many bytes as it did), so that it equals
        ``recorded`` exactly when the input is still the one it was read from. Appending to the
        input never changes it. None: not known."""


@runtime_checkable
class WaitableInput(Protocol):
    """An input that can wait for records instead of being probed again and again (Kafka: a fetch that
    waits at the broker; the file inputs: inotify on their directories). A continuous run's task
    waits on it, after a round that found nothing, when every input of its group offers it and
    :meth:`can_wait` (while records keep arriving, only when every one also :meth:`wakes_at_once`).
    The wait only decides *when* to look: records are still read through :meth:`InputStream.read`,
    so a wait that wakes too early or too late changes latency, never what is read. Optional: without
    it the task sleeps between probes."""

    def can_wait(self) -> bool:
        """Whether waiting works here (False, e.g., where inotify cannot be used: the task probes)."""

    def wakes_at_once(self) -> bool:
        """Whether a wait returns as soon as a record arrives (inotify: the kernel wakes it). False
        when another party decides when a waiting read is answered (a Kafka broker holds a fetch up
        to its wait): a task then waits only once idle, and keeps probing while records arrive."""

    def wait_for_records(self, positions: dict[int, int], timeout: float) -> bool:
        """Wait until any partition of ``positions`` (partition -> position) holds a record at or past
        its position (True, as soon as it does), or ``timeout`` seconds pass (False). Raises
        :class:`~localstate.errors.InputError` when it cannot wait (the caller sleeps instead)."""


@runtime_checkable
class FollowedInput(Protocol):
    """An input that a continuous run's task follows without probing its ends (Kafka: one consumer
    kept assigned, whose fetches carry the partitions' high watermarks and bring the records that
    :meth:`InputStream.read` then hands out). Optional: without it the task asks
    :meth:`InputStream.end_offset` every round."""

    def follow_end(self, partitions: Mapping[int, int]) -> dict[int, int]:
        """Follow ``partitions`` (partition -> position) from here on; return each one's end as last
        seen (at least its position; records below it exist and are readable). Does not wait for
        records. Raises :class:`~localstate.errors.InputError`."""


def follow_end(source: "InputStream", partition: int, position: int) -> int:
    """``partition``'s end for a task that follows ``source`` from ``position``: :class:`FollowedInput`'s
    when it is one, else :meth:`InputStream.end_offset`."""
    if isinstance(source, FollowedInput):
        return source.follow_end({partition: position})[partition]
    return source.end_offset(partition)


IDENTITY_BYTES = 4096
"""Bytes at the start of a file input's first segment that its identity fingerprints (all of them
while the file is shorter; appending never changes bytes already there)."""


class FileIdentities:
    """Identities of a file input's partitions (:class:`IdentifiedInput`), each the first segment the
    partition still has: ``"<base>:<device>:<inode>:<n>:<hash of its first n bytes>"``. A partition
    replaced (renamed over, truncated and written again) has other first bytes, or fewer (the inode
is recorded for the message only: :func:`same_stream`);
    one appended to, the same identity. An identity recorded for a segment that is gone while the
    partition's first segment now starts later (segments read and then deleted by the operator) still
    matches: what was read is not there to compare, and a position below the first record the input
    still holds is refused anyway (:class:`RetainedStart`). Computed identities are kept per file
    status (device, inode, size, modification and change times), so a standing run's frequent
    plans read no file that did not change."""

    def __init__(self) -> None:
        self._seen: dict[tuple[str, int], tuple[tuple[int, ...], str | None]] = {}

    def identity(self, segments: Sequence[tuple[int, Path]], recorded: str | None, *, stream: str,
                 partition: int) -> str | None:
        """The identity of the partition whose segments are ``segments`` (``(base, path)``, by base),
        in the form of ``recorded`` (None: fingerprint up to :data:`IDENTITY_BYTES`)."""
        if not segments:
            return None
        wanted = _parse_identity(recorded)
        if wanted is not None:
            base, length = wanted
            held = dict(segments)
            if base in held:
                return self._of(held[base], base, length, stream, partition)
            if segments[0][0] > base:
                return recorded  # read, then deleted: see the class docstring
        first_base, first = segments[0]
        return self._of(first, first_base, None, stream, partition)

    def _of(self, path: Path, base: int, length: int | None, stream: str, partition: int) -> str | None:
        info = check_regular_file(path, stream=stream, partition=partition)
        if info is None:
            return None
        status = (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)
        key = (str(path), -1 if length is None else length)
        seen = self._seen.get(key)
        if seen is not None and seen[0] == status:
            return seen[1]
        n = min(IDENTITY_BYTES, info.st_size) if length is None else length
        handle = open_regular_file(path, stream=stream, partition=partition)
        if handle is None:
            return None
        with handle:
            opened = os.fstat(handle.fileno())
            head = handle.read(n)
        if not head and length is None:
            found = None  # an empty file: nothing read from it can be checked yet
        else:
            digest = hashlib.blake2b(head, digest_size=12).hexdigest() if len(head) == n else f"short{len(head)}"
            found = f"{base}:{opened.st_dev}:{opened.st_ino}:{n}:{digest}"
        if len(self._seen) > 4096:
            self._seen.clear()
        self._seen[key] = (status, found)
        return found


def same_stream(recorded: str, current: str) -> bool:
    """Whether two identities name one stream. A file identity's device and inode say where the file
    was read, for the message only: they change when a job's folder is copied or restored from a
    backup, the content does not. What decides is the content: the segment, the bytes fingerprinted
    and their hash (a file replaced by one that starts with the same bytes is the same records)."""
    old, new = recorded.split(":"), current.split(":")
    if len(old) == len(new) == 5:
        return (old[0], old[3], old[4]) == (new[0], new[3], new[4])
    return recorded == current


def _parse_identity(recorded: str | None) -> tuple[int, int] | None:
    """``(segment base, bytes fingerprinted)`` of a recorded file identity; None if it is none."""
    if recorded is None:
        return None
    parts = recorded.split(":")
    if len(parts) != 5 or not (parts[0].isdigit() and parts[3].isdigit()):
        return None
    return int(parts[0]), int(parts[3])


def seek_hint(source: str, input_name: str, partition: int) -> str:
    """What to do about a checkpointed position that does not fit input ``input_name`` any more
    (job file ``source``): restore the input, or move the position on purpose with ``localstate seek``."""
    job = source or "job.toml"
    return (f"restore the input's records as they were, or move the position on purpose: `localstate seek {job} "
            f"--input {input_name} --partition {partition} --to-end --yes` continues with records appended from now "
            f"on, `--to-start --yes` processes everything the input holds now (see docs/spark.md, \"When an input "
            f"changes under a job\")")


def check_input_position(source: InputStream, partition: int, position: int | None, end: int,
                         identity: str | None = None) -> None:
    """Raise :class:`~localstate.errors.InputPositionError` if ``position`` (the checkpointed next
    offset of ``source``'s ``partition``; None: the checkpoint names none) does not fit the input as
    it is now: past ``end`` (its current end: the input was replaced, truncated or recreated); for an
    :class:`IdentifiedInput`, read from another stream than the one it is now (``identity``: the one
    the checkpoint recorded; a topic deleted and created again, even refilled past the position); or,
    for a :class:`RetainedStart` input, below the first record it still holds (the records between
    were deleted unread). Planning ``max(position, end)`` instead would report lag 0 and never read
    the records the input holds now; reading from a deleted position would skip the deleted ones."""
    if position is None:
        return
    where = getattr(source.job, "source", None) or ""
    place = source.location()
    found = {} if place is None else {"topic" if place[0] == "kafka" else place[0]: place[1]}
    if position > 0 and identity is not None and isinstance(source, IdentifiedInput):
        current = source.identity(partition, identity)
        if current is not None and not same_stream(identity, current):
            what = (f"another file than the one there now (identity {identity}; now {current}): the input's "
                    f"partition was replaced under the job (renamed over, or truncated and written again), so "
                    f"reading on from {position} would skip the first {min(position, end)} record(s) of the new "
                    f"one" if place is not None and place[0] == "path" else
                    f"another stream of the same name (id {identity}; now {current}): the input was deleted and "
                    f"created again under the job, and its offsets started over, so reading on from {position} "
                    f"would skip the records below it")
            raise InputPositionError(
                f"input {source.name!r} partition {partition}: the checkpoint's position {position} was read from "
                + what, input=source.name, partition=partition, position=position, end=end, recorded_id=identity,
                current_id=current, hint=seek_hint(where, source.name, partition), **found)
    if position > end:
        raise InputPositionError(
            f"input {source.name!r} partition {partition}: the checkpoint's position {position} is past the "
            f"input's end {end}: the input was replaced, truncated or re-created under the job, and reading on "
            f"would skip the {end} record(s) it holds now", input=source.name, partition=partition,
            position=position, end=end, hint=seek_hint(where, source.name, partition), **found)
    if position > 0 and isinstance(source, RetainedStart):
        start = source.start_offset(partition)
        if position < start:
            raise InputPositionError(
                f"input {source.name!r} partition {partition}: the checkpoint's position {position} is below the "
                f"first record the input still holds ({start}): records {position}..{start - 1} were deleted "
                f"before the job read them", input=source.name, partition=partition, position=position, end=end,
                start=start, hint=seek_hint(where, source.name, partition)
                + f"; --to-start moves to {start}, accepting the loss", **found)


def _overlap(a: tuple[str, str], b: tuple[str, str]) -> bool:
    if a[0] != b[0]:
        return False
    if a[0] != "path":
        return a[1] == b[1]
    # String prefixes, not Path.parents: a job with thousands of changelogs compares every pair.
    first, second = os.path.join(str(Path(a[1])), ""), os.path.join(str(Path(b[1])), "")
    return first.startswith(second) or second.startswith(first)


def places_overlap(a: tuple[str, str], b: tuple[str, str]) -> bool:
    """Whether two places in :meth:`InputStream.location` form are the same Kafka topic, or the same
    directory or one inside the other."""
    return _overlap(a, b)


def overlap_problems(inputs: Mapping[str, InputStream], outputs: Mapping[str, OutputStream],
                     protected: Sequence[tuple[str, tuple[str, str]]] = ()) -> list[ConfigProblem]:
    """An output that writes where an input reads (same directory or topic, or one directory inside
    the other), where another output writes, or into one of the ``protected`` places (the job's state
    and changelogs: :func:`~localstate.runtime.layout.state_places`) would destroy that data: one
    problem per pair."""
    problems = []
    places = {name: output.location() for name, output in outputs.items()}
    for name, place in sorted(places.items()):
        if place is None:
            continue
        for label, other in protected:
            if _overlap(place, other):
                problems.append(ConfigProblem(f"outputs.{name}", f"writes into {label} ({other[1]}): "
                                              "truncating the output would destroy the job's state"))
        for input_name, stream in sorted(inputs.items()):
            other = stream.location()
            if other is not None and _overlap(place, other):
                problems.append(ConfigProblem(f"outputs.{name}", f"writes where input {input_name!r} reads "
                                              f"({place[1]} / {other[1]}): the job would overwrite its own input"))
        for other_name, other in sorted(places.items()):
            if other_name > name and other is not None and _overlap(place, other):
                problems.append(ConfigProblem(f"outputs.{name}", f"writes where output {other_name!r} writes "
                                              f"({place[1]} / {other[1]})"))
    return problems


class StreamSystem:
    """A stream system plugin (entry-point group ``localstate.streams``): the input and/or output
    stream classes of one system, e.g. ``jsonl`` or ``kafka``. Register the subclass itself."""

    plugin_api: ClassVar[int] = PLUGIN_API_VERSION
    description: ClassVar[str] = ""
    input: ClassVar[type[InputStream] | None] = None
    output: ClassVar[type[OutputStream] | None] = None


_SIDES = {"inputs": "input", "outputs": "output"}


def _stream_class(job: JobConfig, kind: str, config: StreamConfig) -> type:
    """The input or output class of ``config.system``, loaded through the job's plugin registry
    (so plugins.toml governs stream systems as it does every other plugin)."""
    side = _SIDES[kind]
    registry = job.registry
    try:
        system = registry.load("streams", config.system)
    except PluginNotFoundError:
        system = None
    stream_class = getattr(system, side, None)
    if stream_class is not None:
        return stream_class
    known = sorted(name for name in registry.names("streams") if _offers(registry, name, side))
    raise ConfigError.at(f"{kind}.{config.name}.system",
                         f"unknown {side} system {config.system!r}" + did_you_mean(config.system, known),
                         hint=f"use one of: {', '.join(known)}")


def _offers(registry: Any, name: str, side: str) -> bool:
    try:
        return getattr(registry.load("streams", name), side, None) is not None
    except LocalStateError:
        return False  # a broken plugin is reported by `localstate plugins`, not in this message


def open_input(job: JobConfig, name: str) -> InputStream:
    """Instantiate input ``name`` of ``job`` (options validated, errors at ``inputs.<name>.<option>``)."""
    config = job.inputs[name]
    return _stream_class(job, "inputs", config)(job, config)


def open_output(job: JobConfig, name: str) -> OutputStream:
    config = job.outputs[name]
    return _stream_class(job, "outputs", config)(job, config)
