"""Typed errors. Each carries the thing at fault (store, partition, stream, offset, config path)
and a hint that tells the operator what to do next."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

__all__ = [
    "LocalStateError",
    "ConfigError",
    "ConfigProblem",
    "InvalidNameError",
    "PluginError",
    "PluginNotFoundError",
    "PluginLoadError",
    "PluginRefusedError",
    "SerdeError",
    "StoreError",
    "StoreClosedError",
    "StoreCorruptError",
    "InvalidValueError",
    "LateEventError",
    "ChangelogError",
    "ChangelogCorruptError",
    "CheckpointError",
    "FencedError",
    "ChangelogFencedError",
    "RestoreError",
    "TaskError",
    "StateNotFoundError",
    "ExecutorError",
    "InputError",
    "InputPositionError",
    "TimestampError",
    "MisroutedRecordError",
    "SchemaError",
    "BatchOrderError",
    "OutputError",
    "UnsafePathError",
    "ResourceError",
    "CheckpointIOError",
    "OutputIOError",
    "StoreIOError",
    "TaskImportTimeout",
    "TaskImportInterrupted",
    "SavepointError",
    "SavepointCorruptError",
    "SavepointFormatError",
    "SavepointMismatchError",
    "RescaleError",
    "InputLagError",
    "StateExistsError",
    "PartitionCountError",
]


class LocalStateError(Exception):
    """Base class of every localstate error.

    ``context`` names what was involved (store, partition, stream, offset, path, ...);
    ``hint`` says what the operator should do. Both are rendered into ``str(error)``.
    An error raised by (or through) Python code that failed also carries that code's traceback:
    ``traceback`` (the user's frames first, then the full traceback), ``traceback_summary`` (the
    user's frames and the exception line) and ``location`` (``file:line in function``); the CLI
    prints them. All three are None otherwise.

    An error rebuilt from a failure Spark reported (``localstate.spark.unwrap_error``, a failed batch)
    keeps Spark's whole text in ``spark_message`` (SQLSTATEs, a streaming query's offsets and plan,
    Java frames); its own message ends with its hint. None otherwise.
    """

    traceback: str | None = None
    traceback_summary: str | None = None
    location: str | None = None
    spark_message: str | None = None

    def __init__(self, message: str, *, hint: str | None = None, **context: Any) -> None:
        self.message = message
        self.hint = hint
        self.context = {k: v for k, v in context.items() if v is not None}
        super().__init__(self._render())

    def _render(self) -> str:
        text = self.message
        if self.context:
            text += " [" + ", ".join(f"{k}={v}" for k, v in self.context.items()) + "]"
        if self.hint:
            text += f"\n  what to do: {self.hint}"
        return text

    # Keep context when an error crosses a process boundary (Spark pickles task errors).
    def __reduce__(self):  # type: ignore[override]
        return (_rebuild_error, (type(self), self.message, self.hint, self.context, self.__dict__))


def _rebuild_error(cls, message, hint, context, state):  # noqa: ANN001 - pickle helper
    error = cls.__new__(cls)
    Exception.__init__(error, message)
    error.__dict__.update(state)
    error.message, error.hint, error.context = message, hint, context
    error.args = (error._render(),)
    return error


@dataclass(frozen=True)
class ConfigProblem:
    """One problem in a configuration, at a dotted path such as ``stores.counts.cache_size``."""

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}" if self.path else self.message


class ConfigError(LocalStateError):
    """A job config, option set or policy file is invalid. Lists *every* problem found."""

    def __init__(self, problems: Iterable[ConfigProblem] | str, *, source: str | None = None,
                 hint: str | None = None) -> None:
        if isinstance(problems, str):
            problems = [ConfigProblem("", problems)]
        self.problems = list(problems)
        self.source = source
        where = f" in {source}" if source else ""
        count = len(self.problems)
        header = f"{count} problem{'s' if count != 1 else ''}{where}:"
        body = "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(f"{header}\n{body}", hint=hint or "fix each listed entry and run `localstate validate` again")

    @classmethod
    def at(cls, path: str, message: str, **kwargs: Any) -> "ConfigError":
        return cls([ConfigProblem(path, message)], **kwargs)


class TaskImportTimeout(ConfigError):
    """Importing the task module (``job.task``) did not finish in time: the module blocks while being
    imported (waits on a lock, a socket, a FIFO, ...). A task-loading failure like any other, at
    ``job.task``; ``module``, ``path`` (its file, None if not known yet), ``seconds`` (the timeout) and
    ``blocked_at`` (``file:line`` of the module-level code still running, or None) say which."""

    def __init__(self, module: str, seconds: float, *, path: str | None = None, blocked_at: str | None = None,
                 source: str | None = None) -> None:
        self.module, self.seconds, self.path, self.blocked_at = module, seconds, path, blocked_at
        where = f" ({path})" if path else ""
        at = f", still running {blocked_at}" if blocked_at else ""
        super().__init__([ConfigProblem("job.task", f"importing task module {module!r}{where} did not finish "
                                                    f"within {seconds:g}s{at}")], source=source,
                         hint="a task module must not block when imported (connect, wait or read input in the "
                              "task's init() instead); raise the limit with --import-timeout if it is only slow")


class TaskImportInterrupted(KeyboardInterrupt):
    """Ctrl-C (SIGINT) arrived while the task module was being imported: a KeyboardInterrupt (it is
    never swallowed) that says which module was still importing. ``module`` and ``path`` (its file,
    None if not known yet)."""

    def __init__(self, module: str, path: str | None = None) -> None:
        self.module, self.path = module, path
        super().__init__(f"interrupted while importing task module {module!r}" + (f" ({path})" if path else ""))


class InvalidNameError(ConfigError):
    """A store, job or stream name that could escape the state directory or is otherwise unusable."""


class PluginError(LocalStateError):
    """Base of plugin lookup and loading errors."""


class PluginNotFoundError(PluginError):
    """No plugin of that name in the group."""


class PluginLoadError(PluginError):
    """The plugin exists but importing it failed."""


class PluginRefusedError(PluginError):
    """The plugin is blocked by policy, is not of the right kind, or speaks another plugin API version."""


class SerdeError(LocalStateError):
    """A value could not be serialized or deserialized."""


class StoreError(LocalStateError):
    """Misuse of a store or a failure inside an engine."""


class StoreClosedError(StoreError):
    """The store was used after close()."""


class StoreCorruptError(StoreError):
    """An engine found its *local* state damaged (a failed checksum, a corrupt page or segment).

    Local state is a cache of the changelog: the runtime never treats this as a task bug. The store
    directory is marked corrupt, so the next open (the retried task attempt) discards it and rebuilds
    the store from the changelog."""


class InvalidValueError(StoreError):
    """A key or value the store cannot accept (e.g. None, which is reserved for tombstones)."""


class LateEventError(InvalidValueError):
    """A reorder buffer (heap engine, ``kind = "reorder"``, ``late_policy = "error"``) received an event
    older than its watermark: releasing it would break the total order of the output.

    ``timestamp``, ``watermark`` and ``max_lateness`` (None when unset) are attributes and context."""

    def __init__(self, message: str, *, timestamp: Any, watermark: Any, max_lateness: Any = None,
                 hint: str | None = None, **context: Any) -> None:
        self.timestamp = timestamp
        self.watermark = watermark
        self.max_lateness = max_lateness
        super().__init__(message, hint=hint or "raise max_lateness (or drain later), or set late_policy = "
                         "\"drop\" or \"side_output\" on the store", timestamp=timestamp,
                         watermark=watermark, max_lateness=max_lateness, **context)


class ChangelogError(LocalStateError):
    """A changelog could not be read or written."""


class ChangelogCorruptError(ChangelogError):
    """A changelog record failed its integrity check."""


class CheckpointError(LocalStateError):
    """A checkpoint is missing, unreadable, or inconsistent with the changelog."""


class FencedError(CheckpointError):
    """A newer instance of the same task partition has taken over; this one must stop."""


class RestoreError(LocalStateError):
    """A store could not be brought back to its checkpointed state."""


class TaskError(LocalStateError):
    """The user's task raised; carries the input position being processed."""


class ExecutorError(LocalStateError):
    """A Spark task failed outside the task's own code: an unexpected Python exception in the
    executor (a resource limit, a localstate bug) or a Python worker that died. Carries the Python
    traceback (``traceback``) when there is one."""


class InputError(LocalStateError):
    """An input record could not be decoded or routed."""


class InputPositionError(InputError):
    """A checkpointed input position does not fit the input as it is now: it is past the input's
    end (the input was replaced, truncated or recreated under the job) or below the first record
    the input still holds (records deleted under it, e.g. by Kafka retention). Nothing was read:
    reading on would silently skip the new records, or the deleted ones.

    ``input`` (also ``stream`` in the context), ``partition``, ``position`` (the checkpointed one),
    ``end`` (the end found) and ``start`` (the first offset still held, when that is the problem;
    else None) are attributes and context."""

    def __init__(self, message: str, *, input: str, partition: int, position: int, end: int,  # noqa: A002
                 start: int | None = None, hint: str | None = None, **context: Any) -> None:
        self.input = input
        self.partition = partition
        self.position = position
        self.end = end
        self.start = start
        super().__init__(message, hint=hint, stream=input, partition=partition, position=position, end=end,
                         start=start, **context)


class TimestampError(InputError):
    """A record's timestamp is no event time of its input: not a number (a boolean, a string, a
    list), not finite, or outside the input's plausible range (``min_timestamp`` to ``max_timestamp``,
    seconds, after ``timestamp_unit``). A bad record: the input's ``on_error`` applies, and ``fail``
    raises this, naming the input (``stream``), partition, offset and the timestamp as read
    (``timestamp``)."""


class MisroutedRecordError(InputError):
    """A keyed record sits in an input partition other than the one its key belongs to
    (:func:`~localstate.core.partitioner.partition_for`): its state would be kept in the wrong task
    partition. The input's ``on_misrouted`` applies, and ``fail`` raises this, naming the input
    (``stream``), partition, offset, key and the partition the key belongs to (``owner``)."""


class SchemaError(InputError):
    """A DataFrame handed to a localstate task does not fit it: a named column is missing (the
    columns are listed), or a column's type cannot be converted into the records the task gets."""


class BatchOrderError(CheckpointError):
    """A Spark micro-batch id went backwards past what a job's DataFrame state has kept: the batch
    was applied long ago and its outputs are gone (a query checkpoint reset or reused for another
    query). Carries ``batch`` and the ``committed`` batch."""


class OutputError(LocalStateError):
    """An output stream could not be written (e.g. a Kafka broker did not acknowledge in time)."""


class ChangelogFencedError(ChangelogError, FencedError):
    """A newer writer of the same changelog partition (a newer instance of the task partition) has
    taken over; this one's changelog writes are refused by the broker and it must stop."""


class StateNotFoundError(LocalStateError):
    """What was asked for is not in the job's state: a store, stream or partition the job does not
    have, or a job that has not run with this state directory (``localstate inspect``)."""


class UnsafePathError(LocalStateError):
    """A path localstate would write, truncate or delete is a symlink, leaves its directory, or holds
    something localstate did not create. Nothing was touched."""


class ResourceError(LocalStateError):
    """The operating system refused a file operation at an edge of localstate: permission denied,
    disk full (ENOSPC), file too large (EFBIG), read-only file system (EROFS), a missing state
    directory (ENOENT). ``errno`` is the OS error number; context names the file."""

    def __init__(self, message: str, *, errno: int | None = None, hint: str | None = None,
                 **context: Any) -> None:
        self.errno = errno
        super().__init__(message, hint=hint, **context)


class CheckpointIOError(CheckpointError, ResourceError):
    """A checkpoint or its lock could not be written or opened because of the file system."""


class OutputIOError(OutputError, ResourceError):
    """An output stream partition could not be written because of the file system."""


class StoreIOError(StoreError, ResourceError):
    """A store backend (RocksDB, LMDB, ...) could not open or write its files."""


class SavepointError(LocalStateError):
    """A savepoint (docs/state-as-data.md) could not be written or read: its location is unusable,
    or it does not fit the job it is for."""


class SavepointCorruptError(SavepointError):
    """A savepoint is not whole: it has no manifest (``savepoint.json``, written last: the savepoint
    was never completed), or a file it lists is missing, of another size or fails its sha256.
    Nothing of it was used."""


class SavepointFormatError(SavepointError):
    """A savepoint written in a format this version of localstate does not know (a newer one)."""


class SavepointMismatchError(SavepointError):
    """A savepoint that belongs to another job, or whose stores do not fit the job's (another engine
    kind, another stored layout)."""


class RescaleError(LocalStateError):
    """A rescale, or a start from a savepoint with another partition count, would not be sound: a
    store whose keys do not route to the partition that holds them (``store``, ``partition``,
    ``key``), a store kind that cannot be redistributed, timers that cannot follow their keys.
    Nothing was changed: the job's state is as it was."""


class InputLagError(RescaleError):
    """An input still holds records the old partitions have not processed: after a rescale they
    would reach partitions that do not hold their keys' state. ``input``, ``partition`` and ``lag``
    say which; drain the job first (``localstate run JOB --until-drained``)."""


class StateExistsError(LocalStateError):
    """The target already holds state (a job's checkpoints, a non-empty savepoint folder): nothing
    is overwritten unless the operator says so (``--yes``)."""


class PartitionCountError(ConfigError):
    """The job file's ``partitions`` is not the partition count of the job's state (after a rescale,
    the job file must say the new count). ``job_partitions`` and ``state_partitions`` say both."""

    def __init__(self, message: str, *, job_partitions: int, state_partitions: int, source: str | None = None,
                 hint: str | None = None) -> None:
        self.job_partitions = job_partitions
        self.state_partitions = state_partitions
        super().__init__([ConfigProblem("job.partitions", message)], source=source, hint=hint)
