"""The task API users implement: Samza's StreamTask in Python.

    class PageViewCounter(StreamTask):
        def init(self, context):
            self.counts = context.store("counts")

        def process(self, envelope, collector, coordinator):
            user = envelope.key
            self.counts.put(user, (self.counts.get(user) or 0) + 1)

        def window(self, collector, coordinator):
            for user, count in self.counts.all():
                collector.send("counts", user, count)
"""

from __future__ import annotations

import importlib
import json
import logging
import sys
import threading
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from itertools import repeat
from operator import itemgetter
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Mapping, Protocol, Sequence, TypeVar, \
    overload, runtime_checkable

from localstate.core.stream import base_dir
from localstate.core.text import a
from localstate.core.tracebacks import attach, describe
from localstate.errors import ConfigError, ConfigProblem, TaskImportInterrupted, TaskImportTimeout

if TYPE_CHECKING:
    import pyarrow

    from localstate.core.config import JobConfig
    from localstate.core.time import Timers

__all__ = ["Envelope", "OutgoingMessage", "Collector", "Coordinator", "TaskContext", "StreamTask", "BatchTask",
           "KeyValueStore", "load_task_class", "add_task_paths", "BATCH_COLUMNS", "record_batch", "column_values",
           "TaskCounters", "merge_counts"]

StoreT = TypeVar("StoreT")

log = logging.getLogger(__name__)

IMPORT_WARN_AFTER = 5.0
"""Seconds a task module may take to import before a WARNING names it (and where it is running);
repeated every :data:`IMPORT_WARN_EVERY` seconds while the import goes on."""
IMPORT_WARN_EVERY = 30.0


@dataclass(frozen=True, slots=True)
class Envelope:
    """One input record and where it came from."""

    stream: str
    partition: int
    offset: int
    key: Any
    value: Any
    timestamp: float | None = None


@dataclass(frozen=True, slots=True)
class OutgoingMessage:
    stream: str
    key: Any
    value: Any
    partition: int | None = None


def _message_maker() -> Callable[[str, Any, Any], OutgoingMessage]:
    """``OutgoingMessage(stream, key, value)`` at about half the constructor's cost (the slots set
    through their descriptors, as ``runtime.partition.records.make_envelope`` does for envelopes)."""
    slots = OutgoingMessage.__dict__
    if not all(name in slots for name in ("stream", "key", "value", "partition")):
        return OutgoingMessage
    s_stream, s_key, s_value, s_partition = (slots[n].__set__ for n in ("stream", "key", "value", "partition"))
    new = object.__new__

    def make(stream: str, key: Any, value: Any) -> OutgoingMessage:
        message = new(OutgoingMessage)
        s_stream(message, stream)
        s_key(message, key)
        s_value(message, value)
        s_partition(message, None)
        return message

    return make


_message = _message_maker()


def _py_list(values: Any) -> list[Any]:
    """A list of Python objects from a list, a pyarrow Array/ChunkedArray or any iterable."""
    if isinstance(values, list):
        return values
    to_pylist = getattr(values, "to_pylist", None)
    return to_pylist() if to_pylist is not None else list(values)


class Collector:
    """Collects the task's output messages; they are delivered at commit."""

    def __init__(self) -> None:
        self.pending: list[OutgoingMessage] = []

    def send(self, stream: str, key: Any, value: Any, partition: int | None = None) -> None:
        """Emit ``(key, value)`` to output ``stream``, delivered at the next commit. File and JSON-lines
        outputs write it to the producing task's partition, Kafka outputs by key; ``partition`` is
        recorded on the message, but no built-in output uses it (docs/task-api.md)."""
        self.pending.append(OutgoingMessage(stream, key, value, partition))

    def send_batch(self, stream: str, keys: Iterable[Any], values: Iterable[Any]) -> None:
        """``send(stream, key, value)`` for each pair, in order (lists, pyarrow arrays or iterables of
        equal length): how a :class:`BatchTask` emits a column of results."""
        keys, values = _py_list(keys), _py_list(values)
        if len(keys) != len(values):
            raise ValueError(f"send_batch({stream!r}): {len(keys)} keys but {len(values)} values")
        self.pending.extend(map(_message, repeat(stream), keys, values))

    def take(self) -> list[OutgoingMessage]:
        pending, self.pending = self.pending, []
        return pending


class Coordinator:
    """Lets the task ask for a commit after the current call, or for the task to shut down."""

    def __init__(self) -> None:
        self.commit_requested = False
        self.shutdown_requested = False

    def commit(self) -> None:
        self.commit_requested = True

    def shutdown(self) -> None:
        self.shutdown_requested = True


class TaskCounters:
    """Counts of what a task partition dropped or redirected, by kind and label (``late_records`` per
    window store, ``misrouted`` per input): task-side code (the windows library) and the runtime add
    to them, and the runtime takes them when it prepares each commit, reporting them with the
    committed batch (progress, ``localstate status``, Prometheus). So a count is exactly what the
    committed batches did: an attempt that fails is rolled back with its counts, and the retry counts
    again."""

    __slots__ = ("_counts",)

    def __init__(self) -> None:
        self._counts: dict[str, dict[str, int]] = {}

    def add(self, kind: str, label: str, n: int = 1) -> int:
        """Count ``n`` more of ``kind`` for ``label``; returns the count since the last :meth:`take`
        (1: the first of this commit interval, e.g. to log it once per batch)."""
        counts = self._counts.setdefault(kind, {})
        counts[label] = total = counts.get(label, 0) + n
        return total

    def take(self) -> dict[str, dict[str, int]]:
        """Every count since the last take (``{kind: {label: n}}``), and start over from zero."""
        counts, self._counts = self._counts, {}
        return counts


def merge_counts(into: dict[str, dict[str, int]], counts: Mapping[str, Mapping[str, int]]) -> None:
    """Add ``counts`` (as :meth:`TaskCounters.take` returns them) into ``into``."""
    for kind, labels in counts.items():
        totals = into.setdefault(kind, {})
        for label, n in labels.items():
            totals[label] = totals.get(label, 0) + n


@dataclass
class TaskContext:
    """What ``init`` receives: the partition, the job's name and config, and the stores."""

    job: str
    partition: int
    partitions: int
    stores: Mapping[str, Any]
    config: Any = None
    metrics: dict[str, float] = field(default_factory=dict)
    """free for the task's own figures; the runtime does not read it (see :attr:`counters`)"""
    timers: "Timers | None" = None
    """the partition's timers and time (:class:`~localstate.core.time.Timers`): register and delete
    per-key timers, read the watermark and the processing time. Registering needs ``[time] timers =
    true`` in the job (a ConfigError naming it otherwise)."""
    counters: TaskCounters = field(default_factory=TaskCounters)
    """counts the runtime reports with each committed batch (:class:`TaskCounters`): the windows
    library counts its late records here"""

    @overload
    def store(self, name: str) -> Any: ...

    @overload
    def store(self, name: str, kind: type[StoreT]) -> StoreT: ...

    def store(self, name: str, kind: type[Any] | None = None) -> Any:
        """The store's typed API (a KeyValueEngine, a heap, a sketch store, a search index...).
        With ``kind`` (a class, or a runtime-checkable Protocol such as :class:`KeyValueStore`) the
        store is checked to be one, so a job config declaring another engine fails at ``init``
        with a ConfigError naming the store, rather than later with an AttributeError."""
        try:
            store = self.stores[name]
        except KeyError:
            raise ConfigError.at(f"stores.{name}", f"the task asked for store {name!r}, which the job does not "
                                 f"declare; declared: {', '.join(sorted(self.stores)) or '(none)'}",
                                 hint=f"add a [stores.{name}] table to the job config") from None
        if kind is not None and not isinstance(store, kind):
            raise ConfigError.at(f"stores.{name}.engine",
                                 f"the task asked for store {name!r} as {a(kind.__name__)}, but the job's engine "
                                 f"gives {a(type(store).__name__)}",
                                 hint=f"declare the engine the task expects in [stores.{name}], or ask for the "
                                      f"store as {a(type(store).__name__)}")
        return store

    def kv(self, name: str) -> "KeyValueStore":
        """Store ``name`` as a key-value store (the ``kv`` engine, on any backend); a ConfigError if
        the job declares another engine for it."""
        return self.store(name, KeyValueStore)


@runtime_checkable
class KeyValueStore(Protocol):
    """The key-value API tasks use (what the ``kv`` engine's KeyValueEngine offers). A Protocol, so
    the task API names no engine: any store with these methods is one."""

    def get(self, key: Any) -> Any: ...

    def get_all(self, keys: Iterable[Any]) -> dict[Any, Any]: ...

    def put(self, key: Any, value: Any) -> None: ...

    def put_all(self, entries: Mapping[Any, Any] | Iterable[tuple[Any, Any]]) -> None: ...

    def delete(self, key: Any) -> None: ...

    def delete_all(self, keys: Iterable[Any]) -> None: ...

    def range(self, start: Any = None, end: Any = None, reverse: bool = False) -> Iterator[tuple[Any, Any]]: ...

    def prefix(self, prefix: Any, reverse: bool = False) -> Iterator[tuple[Any, Any]]: ...

    def all(self, reverse: bool = False) -> Iterator[tuple[Any, Any]]: ...

    # -- batched operations: one call for a column of keys (a BatchTask's batch) ------------------
    def get_many(self, keys: Iterable[Any]) -> list[Any]:
        """The values of ``keys`` in order, None for an absent key."""
        ...

    def put_many(self, keys: Iterable[Any], values: Iterable[Any]) -> None:
        """``put(k, v)`` for each pair, in order (a key given twice keeps its last value)."""
        ...

    def merge_many(self, keys: Iterable[Any], deltas: Iterable[Any], op: str = "add", *,
                   results: bool = False) -> list[Any] | None:
        """Read-modify-write in one pass: each key's value becomes ``delta`` if absent, else the
        current value combined with it by ``op`` (``add``, ``min``, ``max``); with ``results``, the
        new values in order."""
        ...


class StreamTask(ABC):
    """A stream task. One instance per job partition; calls on it are never concurrent."""

    def init(self, context: TaskContext) -> None:
        """Called once after the stores are restored, before the first record."""

    @abstractmethod
    def process(self, envelope: Envelope, collector: Collector, coordinator: Coordinator) -> None:
        """Handle one input record."""

    def window(self, collector: Collector, coordinator: Coordinator) -> None:
        """Called every ``window_interval`` (if configured)."""

    def on_timer(self, key: Any, timestamp: float, collector: Collector, coordinator: Coordinator) -> None:
        """A timer registered through ``context.timers`` for ``key`` at ``timestamp`` fired
        (``context.timers.firing_domain`` says in which domain). Called at a batch boundary, in
        timestamp order, exactly once per timer: its outputs and its deletion commit together. A task
        that registers timers must override it."""
        raise NotImplementedError  # the runtime refuses the registration before this can be reached

    def close(self) -> None:
        """Called when the task instance stops cleanly."""


BATCH_COLUMNS = ("key", "value", "timestamp", "offset")
"""The columns of every batch a :class:`BatchTask` receives, in this order; ``stream`` follows when
the batch holds rows of several inputs (or the job has several)."""


class BatchTask(StreamTask):
    """A task that receives its input as Arrow columns: one call per batch of a partition's rows.

    ``process_batch(batch, collector, coordinator)`` gets a ``pyarrow.RecordBatch`` with the columns
    :data:`BATCH_COLUMNS` (``key``, ``value``, ``timestamp`` float64 seconds or null, ``offset``
    int64), plus ``stream`` (string) when the job has several inputs; rows in the order a
    :class:`StreamTask` would see them. ``init``, ``window``, ``close``, the stores, the collector and
    the coordinator are a StreamTask's. A commit never splits a batch, and a retry re-delivers whole
    batches (docs/task-api.md, "Batch tasks")."""

    @abstractmethod
    def process_batch(self, batch: "pyarrow.RecordBatch", collector: Collector, coordinator: Coordinator) -> None:
        """Handle a batch of input rows, in order."""

    def process(self, envelope: Envelope, collector: Collector, coordinator: Coordinator) -> None:
        """One record as a one-row batch (the runtime calls :meth:`process_batch` itself)."""
        batch = record_batch([envelope.stream], [envelope.offset], [envelope.key], [envelope.value],
                             [envelope.timestamp])
        self.process_batch(batch, collector, coordinator)


def record_batch(streams: list[str], offsets: Sequence[int], keys: list[Any], values: list[Any],
                 timestamps: list[float | None], *, with_stream: bool = False) -> "pyarrow.RecordBatch":
    """The batch a :class:`BatchTask` receives for rows given as Python lists (one entry per row;
    ``streams`` may be one name for all; ``keys``, ``values`` and ``timestamps`` may also be pyarrow
    arrays, taken as they are). Keys and values are typed by pyarrow's inference; a column
    it cannot type (mixed types) holds each value's JSON text instead, with field metadata
    ``{"localstate.encoding": "json"}``. ``stream`` is added with ``with_stream`` or when the rows
    come from several streams; a batch of one stream names it in the schema metadata
    (``localstate.stream``)."""
    import pyarrow as pa  # imported when used: only batch tasks need pyarrow, and core stays light to import

    several = with_stream or len(set(streams)) > 1
    (key, key_meta), (value, value_meta) = _column(pa, keys), _column(pa, values)
    times = timestamps if isinstance(timestamps, pa.Array) else pa.array(timestamps, pa.float64())
    if isinstance(offsets, range):  # consecutive offsets (an input read as Arrow): no Python int per row
        import numpy as np  # as pyarrow above: `import localstate` loads neither

        offset_array = pa.array(np.arange(offsets.start, offsets.stop, offsets.step, dtype=np.int64))
    else:
        offset_array = pa.array(offsets, pa.int64())
    arrays = [key, value, times, offset_array]
    fields = [pa.field("key", key.type, metadata=key_meta), pa.field("value", value.type, metadata=value_meta),
              pa.field("timestamp", pa.float64()), pa.field("offset", pa.int64())]
    if several:
        arrays.append(pa.array(streams if len(streams) == len(offsets) else streams * len(offsets), pa.string()))
        fields.append(pa.field("stream", pa.string()))
    metadata = None if several or not streams else {"localstate.stream": streams[0]}
    return pa.RecordBatch.from_arrays(arrays, schema=pa.schema(fields, metadata=metadata))


def column_values(batch: "pyarrow.RecordBatch", name: str) -> list[Any]:
    """Column ``name`` of a batch as Python values, one per row: ``to_pylist()``, or each row's JSON
    text decoded when the column holds JSON text (:func:`record_batch`'s columns pyarrow cannot hold
    exactly, such as values of several shapes). The values are then those a :class:`StreamTask`'s
    envelopes carry."""
    field = batch.schema.field(name)
    values = batch.column(name).to_pylist()
    if field.metadata and field.metadata.get(b"localstate.encoding") == b"json":
        return [None if text is None else json.loads(text) for text in values]
    return values


_SCALARS = {str, int, float, bool, bytes}
"""Python classes whose column pyarrow types exactly (each value comes back as it was given)."""


def _column(pa: Any, values: list[Any]) -> tuple[Any, dict[str, str] | None]:
    """``(array, None)`` when pyarrow holds ``values`` exactly (each value reads back as the same
    Python value of the same class), else their JSON text and field metadata saying so.

    Exactly: a column of one scalar class (str, int within 64 bits, float, bool, bytes), or of
    dicts/lists that read back with the same JSON text. pyarrow's own inference would widen
    ``[1, 2.5]`` to floats and give ``[{"a": 1}, {"b": 2}]`` every field in every row: a batch task
    would then store ``1.0`` where a per-record task stores ``1``."""
    if isinstance(values, pa.Array):  # an input's Arrow column, exact already (ColumnarInput)
        return values, None
    classes = set(map(type, values))
    classes.discard(type(None))
    try:
        if not classes:
            return pa.array(values), None
        if len(classes) == 1 and classes <= _SCALARS:
            # inferred, not typed: pyarrow builds a string column several times faster so, and the
            # type it infers for one class is that class's (an int beyond 64 bits raises)
            return pa.array(values), None
        if classes == {dict}:
            array = _struct(pa, values)
            if array is not None:
                return array, None
        if classes <= {dict, list}:
            array = pa.array(values)
            if json.dumps(array.to_pylist()) == json.dumps(values):
                return array, None
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, TypeError, ValueError, OverflowError):
        pass
    text = [None if v is None else json.dumps(v, default=str) for v in values]  # key order as given
    return pa.array(text, pa.string()), {"localstate.encoding": "json"}


def _struct(pa: Any, rows: list[dict[str, Any]]) -> Any:
    """A struct column of ``rows`` built field by field when every row has the same fields in the same
    order and each field's column is exact (:func:`_column`); else None. Cheaper than inferring the
    struct and reading it back, which is the check for any other nested column."""
    shapes = set(map(tuple, rows))
    if len(shapes) != 1:
        return None
    (names,) = shapes
    if not names or not all(isinstance(name, str) for name in names):
        return None
    arrays = []
    for name in names:
        array, meta = _column(pa, list(map(itemgetter(name), rows)))
        if meta is not None:
            return None
        arrays.append(array)
    return pa.StructArray.from_arrays(arrays, names=list(names))


def load_task_class(spec: str | type | Callable[[], StreamTask], *,
                    timeout: float | None = None) -> Callable[[], StreamTask]:
    """Resolve ``module:Class`` (or pass a class or factory through) to a zero-argument factory.

    A module that fails to import is a ConfigError at ``job.task`` naming it. A module that is slow
    to import is watched: after :data:`IMPORT_WARN_AFTER` seconds a WARNING names the module, its
    file and the line its module-level code is running. Ctrl-C during the import raises
    :class:`~localstate.errors.TaskImportInterrupted` (a KeyboardInterrupt naming the module).

    ``timeout`` (seconds; None: wait as long as it takes): import on a daemon helper thread and give
    up after that long with :class:`~localstate.errors.TaskImportTimeout`; the import itself cannot
    be stopped and goes on in the background, so the caller should end soon after (``localstate
    validate`` does). Without it the module is imported on the calling thread, as Python would."""
    if not isinstance(spec, str):
        return spec
    module_name, _, attr = spec.partition(":")
    try:
        obj: Any = _import_task_module(module_name, timeout)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except (KeyboardInterrupt, TaskImportTimeout):
        raise
    except BaseException as exc:  # user code can fail to import in any way, sys.exit() included
        raise _load_error(spec, module_name, exc) from exc
    if not (isinstance(obj, type) and issubclass(obj, StreamTask)):
        raise ConfigError([ConfigProblem("job.task", f"{spec!r} is not a StreamTask subclass (BatchTask is one)")],
                          hint="subclass localstate.StreamTask, or localstate.BatchTask for Arrow batches")
    return obj


def _import_task_module(name: str, timeout: float | None) -> Any:
    """Import module ``name`` under an :class:`_ImportWatch` (see :func:`load_task_class`)."""
    loaded = sys.modules.get(name)
    if loaded is not None and not getattr(getattr(loaded, "__spec__", None), "_initializing", False):
        return importlib.import_module(name)  # imported already: nothing to watch
    if timeout is None:
        with _ImportWatch(name, threading.get_ident()) as watch:
            try:
                return importlib.import_module(name)
            except KeyboardInterrupt as exc:
                # The failed import took the module out of sys.modules: its file is in the traceback.
                raise TaskImportInterrupted(name, watch.path() or _module_file(exc, name)) from None
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["module"] = importlib.import_module(name)
        except BaseException as exc:  # noqa: BLE001 - handed to the calling thread as it is
            outcome["error"] = exc

    worker = threading.Thread(target=run, name=f"localstate-import-{name}", daemon=True)
    with _ImportWatch(name, None) as watch:
        worker.start()
        watch.ident = worker.ident
        try:
            worker.join(timeout)
        except KeyboardInterrupt:
            raise TaskImportInterrupted(name, watch.path()) from None
        if worker.is_alive():
            raise TaskImportTimeout(name, timeout, path=watch.path(), blocked_at=watch.blocked_at())
    if "error" in outcome:
        raise outcome["error"]
    return outcome["module"]


def _module_file(exc: BaseException, module: str) -> str | None:
    """The file of module ``module`` if its module-level code is among ``exc``'s traceback frames."""
    tb = exc.__traceback__
    while tb is not None:
        frame = tb.tb_frame
        if frame.f_code.co_name == "<module>" and frame.f_globals.get("__name__") == module:
            return frame.f_code.co_filename
        tb = tb.tb_next
    return None


class _ImportWatch:
    """While a task module is imported: a daemon watchdog thread that logs a WARNING naming the module
    after :data:`IMPORT_WARN_AFTER` seconds, and every :data:`IMPORT_WARN_EVERY` seconds after, until
    the import ends (the watch is left). It only reads: it never interrupts the import."""

    def __init__(self, module: str, ident: int | None) -> None:
        self.module = module
        self.ident = ident
        """the thread doing the import (its stack says where the import is)"""
        self._done = threading.Event()
        self._started = time.monotonic()

    def __enter__(self) -> "_ImportWatch":
        log.debug("importing task module %r", self.module)
        threading.Thread(target=self._watch, name=f"localstate-import-watch-{self.module}", daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()

    def _watch(self) -> None:
        wait = IMPORT_WARN_AFTER
        while not self._done.wait(wait):
            at = self.blocked_at()
            log.warning("still importing task module %r (%s) after %.0fs%s: a task module should not block "
                        "when imported", self.module, self.path() or "file not found yet",
                        time.monotonic() - self._started, f", running {at}" if at else "")
            wait = IMPORT_WARN_EVERY

    def path(self) -> str | None:
        """The module's file, once the import has found it (None before)."""
        module = sys.modules.get(self.module)
        spec = getattr(module, "__spec__", None)
        return getattr(module, "__file__", None) or getattr(spec, "origin", None)

    def blocked_at(self) -> str | None:
        """``file:line`` of the innermost module-level code the importing thread is running (the task
        module, or a module it imports), or None."""
        frame = sys._current_frames().get(self.ident) if self.ident is not None else None
        while frame is not None:
            if frame.f_code.co_name == "<module>" and not frame.f_code.co_filename.startswith("<"):
                return f"{frame.f_code.co_filename}:{frame.f_lineno}"
            frame = frame.f_back
        return None


def _load_error(spec: str, module_name: str, exc: BaseException) -> ConfigError:
    """The ConfigError for a task that failed to load, naming the module and, when the failure is
    in the user's module, its file and line."""
    trace = describe(exc, importing=True)
    if isinstance(exc, SystemExit):
        what = f"module {module_name!r} called sys.exit({exc.code!r}) while being imported"
    else:
        what = f"{trace.type_name}: {' '.join(trace.message.split())[:500]}"
    where = f" at {trace.location}" if trace.in_user_code else ""
    error = ConfigError([ConfigProblem("job.task", f"cannot load task {spec!r}: {what}{where}")],
                        hint="check the module is importable (on every executor), does not exit or raise when "
                             "imported, and defines the class")
    attach(error, trace)
    return error


def add_task_paths(job: "JobConfig") -> None:
    """Put the job file's directory and ``job.pythonpath`` entries on ``sys.path``, so that
    ``job.task = "module:Class"`` finds a module kept next to the job file."""
    for path in [base_dir(job), *(Path(p) for p in job.pythonpath)]:
        path = path if path.is_absolute() else base_dir(job) / path
        if str(path) not in sys.path:
            sys.path.insert(0, str(path))
