"""Task instances kept open across micro-batches inside a Python worker.

Opening a partition (lock, open every store, open the changelog writers, take a new generation)
costs tens of milliseconds per batch, and a fresh instance starts with a cold object cache. Spark
reuses Python workers across tasks (``spark.python.worker.reuse``, on by default), so a worker can
keep the instance of the partition it just ran open, with its stores, changelog writers, output
writers and caches, and use it again if the next task it gets is for the same partition.

Which worker gets which partition's next task is up to Spark, so a kept instance is a *lease* that
must be given back on demand, and validated before reuse:

* **Reuse only what the driver committed.** A kept instance remembers the checkpoint it prepared.
  It is reused only if the checkpoint on disk is exactly that one (same generation, positions and
  changelog offsets): then the driver committed this instance's last batch and nobody touched the
  partition since (the instance held its locks throughout). Otherwise — the batch was not committed,
  a retried attempt, another instance took the partition — it is closed without committing and the
  partition is reopened, which recovers it to the checkpoint. Kept instances are also keyed by the
  run (``run_id``): nothing is reused across two runs of a job.
* **Tasks go where the state is.** A batch's Spark tasks are interchangeable slots: each claims
  one of the batch's partitions (:func:`claim`), preferring the one its worker keeps open, so the
  partitions stay with their workers whatever order Spark hands the tasks to workers in. A slot
  leaves a partition that another live worker keeps to that worker's slot for up to
  :data:`KEEPER_GRACE` seconds. When a batch has fewer partitions than the run has live workers (a
  1-partition job on a context whose earlier jobs started two workers, partitions without new
  input), the driver adds spare slots, so that every idle worker gets one and the keepers are among
  them (Spark hands a task to the worker idle the longest, which is rarely the keeper); a spare slot
  that finds every partition claimed returns at once.
* **At most one kept instance per worker**: a task first gives back whatever its worker kept for
  another partition, so two workers that swap partitions free them for each other.
* **Give back on request.** A task (or the driver) that finds a partition locked creates
  ``<checkpoints>/<partition>.want``; while its worker is idle, a watcher thread of the worker
  holding that partition sees the file within milliseconds and closes the instance, releasing its
  locks. The waiter then takes the lock (up to :data:`LOCK_TIMEOUT` seconds, after which it fails
  with FencedError as a second live instance does). The driver does the same at the end of every
  run, so no instance outlives ``SparkJobRunner.run()``.

The watcher only looks while its worker runs no task, so it never competes with a running task.
"""

from __future__ import annotations

import ctypes
import gc
import importlib
import logging
import os
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

from pyspark import TaskContext

from localstate.core.changelog import ChangelogPartition, ChangelogRecord, ChangelogSystem, RecordColumns
from localstate.core.checkpoint import Checkpoint, CheckpointStore
from localstate.core.config import JobConfig
from localstate.core.fsutil import ensure_dir, open_nofollow, os_error
from localstate.runtime.partition.recovery import StoreRecovery
from localstate.runtime.layout import open_changelog_system
from localstate.runtime.partition.committer import BatchCommits
from localstate.runtime.partition.instance import TaskInstance
from localstate.runtime.spark.cluster import PlannedCheckpoints, executor_local_root
from localstate.runtime.driver.plan import PartitionPlan
from localstate.runtime.partition.sink import StreamSink
from localstate.core.task import BatchTask, OutgoingMessage, load_task_class
from localstate.errors import CheckpointIOError, FencedError, LocalStateError

__all__ = ["Lease", "checkout", "checkin", "release_kept", "kept_partition", "claim", "try_claim",
           "claimed_by", "open_planned", "acquire_partition", "clear_requests", "release_partitions", "is_alive",
           "settle_worker", "task_context", "return_free_memory", "LOCK_TIMEOUT", "KEEPER_GRACE"]

log = logging.getLogger(__name__)

LOCK_TIMEOUT = 30.0
"""Seconds a task waits for another instance of its partition to give it back."""
KEEPER_GRACE = 0.5
"""Seconds a slot leaves a partition kept open by another live worker to that worker's own slot of
the batch (they start together) before claiming it itself and asking for it back."""
_POLL = 0.002
_WATCH = 0.005
_WATCH_IDLE = 0.05
"""The watcher looks for a request to give its kept instance back every :data:`_WATCH` seconds for
:data:`_WATCH_BUSY_FOR` seconds after the instance was checked in (while batches follow each other),
then every :data:`_WATCH_IDLE` seconds: a standing job without input costs ~20 wake-ups a second per
worker, not 200, and a request then waits up to 50 ms."""
_WATCH_BUSY_FOR = 1.0


class _TimedChangelog(ChangelogPartition):
    """Delegates to a changelog partition and adds the time spent appending and flushing to
    ``clock["changelog"]`` (what a commit spends on the changelog, as opposed to the store)."""

    def __init__(self, inner: ChangelogPartition, clock: dict[str, float]) -> None:
        self._inner = inner
        self._clock = clock
        self.stream = inner.stream
        self.partition = inner.partition

    def append(self, key: bytes, value: bytes | None) -> None:
        started = time.perf_counter()
        self._inner.append(key, value)
        self._clock["changelog"] += time.perf_counter() - started

    def append_many(self, records: Iterable[tuple[bytes, bytes | None]]) -> None:
        started = time.perf_counter()
        self._inner.append_many(records)
        self._clock["changelog"] += time.perf_counter() - started

    def flush(self) -> int:
        started = time.perf_counter()
        end = self._inner.flush()
        self._clock["changelog"] += time.perf_counter() - started
        return end

    def end_offset(self) -> int:
        return self._inner.end_offset()

    def read(self, start: int = 0, end: int | None = None) -> Iterator[ChangelogRecord]:
        return self._inner.read(start, end)

    def read_batches(self, start: int = 0, end: int | None = None) -> Iterator[list[ChangelogRecord]]:
        return self._inner.read_batches(start, end)

    def read_columns(self, start: int = 0, end: int | None = None) -> Iterator[RecordColumns]:
        return self._inner.read_columns(start, end)

    def close(self) -> None:
        self._inner.close()

    def __getattr__(self, name: str) -> Any:  # anything else a system offers (e.g. truncate)
        return getattr(self._inner, name)


class _TimedSink:
    """Delegates to the job's :class:`StreamSink` and adds the time spent writing outputs to
    ``clock["outputs"]``."""

    def __init__(self, inner: StreamSink, clock: dict[str, float]) -> None:
        self._inner = inner
        self._clock = clock

    @property
    def inner(self) -> StreamSink:
        """The sink this one times (the one given to :func:`checkout`)."""
        return self._inner

    @property
    def written(self) -> int:
        return self._inner.written

    def write(self, partition: int, messages: list[OutgoingMessage]) -> Mapping[str, int]:
        started = time.perf_counter()
        positions = self._inner.write(partition, messages)
        self._clock["outputs"] += time.perf_counter() - started
        return positions

    def rollback(self, partition: int, positions: Mapping[str, int]) -> Mapping[str, int] | None:
        return self._inner.rollback(partition, positions)

    @property
    def transactional(self) -> bool:
        return self._inner.transactional

    def pending(self, partition: int) -> dict[str, dict[str, Any]]:
        return self._inner.pending(partition)

    def commit(self, partition: int) -> None:
        self._inner.commit(partition)

    def resume(self, partition: int, transactions: Mapping[str, Mapping[str, Any]]) -> None:
        self._inner.resume(partition, transactions)

    def fence(self, partition: int) -> None:
        self._inner.fence(partition)

    def close(self) -> None:
        self._inner.close()


class _TimedChangelogs(ChangelogSystem):
    """The job's changelog system, handing out :class:`_TimedChangelog` partitions."""

    def __init__(self, inner: ChangelogSystem, clock: dict[str, float]) -> None:
        self._inner = inner
        self._clock = clock

    def ensure_stream(self, stream: str, partitions: int) -> None:
        self._inner.ensure_stream(stream, partitions)

    def partition(self, stream: str, partition: int) -> ChangelogPartition:
        return _TimedChangelog(self._inner.partition(stream, partition), self._clock)

    def close(self) -> None:
        self._inner.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


@dataclass(eq=False)
class Lease:
    """One open task partition, its changelog system and output sink, as used by one Spark task."""

    key: tuple[Any, ...]
    instance: TaskInstance
    changelogs: ChangelogSystem
    sink: _TimedSink
    clock: dict[str, float]
    """seconds accumulated since the instance opened: ``changelog`` (append + flush), ``outputs``"""
    recoveries: list[StoreRecovery] = field(default_factory=list)
    """what opening did in this checkout (empty when the instance was reused)"""
    reused: bool = False
    waited: float = 0.0
    """seconds this checkout waited for the partition's lock"""
    prepared: Checkpoint | None = None
    """the checkpoint the last batch prepared (what the driver saves if the batch succeeds)"""

    def is_current(self) -> bool:
        """True if the driver committed exactly what this instance prepared last."""
        instance = self.instance
        if self.prepared is None or instance.task is None:
            return False
        try:
            return instance.checkpoints.load(instance.partition) == self.prepared
        except LocalStateError:  # unreadable checkpoint: the fresh open reports it properly
            return False

    def close(self) -> None:
        """Close without committing and release every lock; the partition lock goes last, so whoever
        takes it next finds the output writers and changelog partitions free."""
        instance = self.instance
        try:
            self.sink.close()
            instance.close(commit=False)
        except Exception:  # noqa: BLE001 - the locks must go whatever failed
            log.exception("closing task partition %d failed", instance.partition)
        finally:
            try:
                self.changelogs.close()
            finally:
                instance.checkpoints.unlock(instance.partition)


# -- the worker's kept instance ----------------------------------------------------------------
_mutex = threading.Condition()
_kept: Lease | None = None
_watcher: threading.Thread | None = None
_checked_in = 0.0  # time.monotonic() of the last checkin (the watcher's pace)


def _want_file(checkpoints: CheckpointStore, partition: int) -> Path:
    return checkpoints.root / f"{int(partition)}.want"


def _ask_back(checkpoints: CheckpointStore, partition: int) -> Path:
    """Leave the request that the worker keeping ``partition`` open gives it back (its ``.want``
    file), never through a symlink planted at its name (UnsafePathError)."""
    want = _want_file(checkpoints, partition)
    os.close(open_nofollow(want, os.O_WRONLY | os.O_CREAT))
    return want


def _watch() -> None:
    """Give the kept instance back as soon as someone asks for its partition."""
    global _kept
    while True:
        with _mutex:
            while _kept is None:
                _mutex.wait()
            lease = _kept
            if _want_file(lease.instance.checkpoints, lease.instance.partition).exists():
                _kept = None
                lease.close()
                continue
            idle = time.monotonic() - _checked_in > _WATCH_BUSY_FOR
        time.sleep(_WATCH_IDLE if idle else _WATCH)


def release_kept() -> None:
    """Close the instance this process keeps, if any."""
    global _kept
    with _mutex:
        lease, _kept = _kept, None
    if lease is not None:
        lease.close()


def acquire_partition(checkpoints: CheckpointStore, partition: int, timeout: float = LOCK_TIMEOUT) -> float:
    """Take ``partition``'s instance lock on ``checkpoints``, asking a worker that keeps it open to
    give it back. Returns the seconds waited; raises FencedError after ``timeout``."""
    started = time.perf_counter()
    want = None
    try:
        while True:
            try:
                checkpoints.lock(partition)
                return time.perf_counter() - started
            except FencedError:
                if time.perf_counter() - started > timeout:
                    raise
                if want is None:
                    want = _ask_back(checkpoints, partition)
                time.sleep(_POLL)
    finally:
        if want is not None:
            want.unlink(missing_ok=True)


def clear_requests(checkpoints: CheckpointStore, partitions: Iterable[int]) -> None:
    """Remove give-back requests left by a task that died while waiting (a stale request only
    stops instances of that partition from being kept; this restores it at the start of a run)."""
    for partition in partitions:
        _want_file(checkpoints, partition).unlink(missing_ok=True)


def release_partitions(checkpoints: CheckpointStore, partitions: Iterable[int], timeout: float = LOCK_TIMEOUT) -> None:
    """Driver side, at the end of a run: make every worker give back its instances of
    ``partitions`` (so the state can be opened by anyone once the run returns)."""
    release_kept()  # run_partition called in this very process (tests)
    partitions = list(partitions)
    for partition in partitions:  # ask all at once, then collect
        _ask_back(checkpoints, partition)
    try:
        for partition in partitions:
            try:
                acquire_partition(checkpoints, partition, timeout)
                checkpoints.unlock(partition)
            except FencedError:
                log.warning("task partition %d is still held by a running task after %.0fs", partition, timeout)
    finally:
        clear_requests(checkpoints, partitions)


def kept_partition(job: JobConfig, run_id: str) -> int | None:
    """The partition of ``job`` this worker keeps open for run ``run_id``, if any."""
    with _mutex:
        lease = _kept
    if lease is not None and lease.key[:3] == (run_id, str(job.state_dir), job.name):
        return lease.key[3]
    return None


def claim(directory: Path, partitions: Sequence[int], slot: int, prefer: int | None,
          keepers: Mapping[int, int] | None = None, grace: float = KEEPER_GRACE) -> int | None:
    """:func:`_claim`, with a file-system failure (read-only or full state directory) as a typed
    CheckpointIOError naming the claims directory."""
    try:
        return _claim(directory, partitions, slot, prefer, keepers or {}, grace)
    except OSError as exc:
        raise os_error(exc, "claim a partition in", directory, CheckpointIOError, slot=slot) from exc


def _claim(directory: Path, partitions: Sequence[int], slot: int, prefer: int | None,
           keepers: Mapping[int, int], grace: float) -> int | None:
    """Claim one of ``partitions`` for Spark task ``slot`` of a batch (``directory`` is the batch's,
    shared by its tasks): the one this slot claimed before (a retried attempt continues with it),
    else ``prefer`` (the partition this worker keeps open) if free, else the first free one that no
    other live worker keeps (``keepers``: partition -> pid of the worker the driver last saw run it);
    a partition kept by another live worker is left to that worker's slot for ``grace`` seconds,
    then claimed like any other. Returns None when every partition is claimed: a spare slot (the
    driver runs more slots than partitions when the run has more live workers than the batch has
    partitions; otherwise, with one slot per partition, a free one is always left)."""
    for partition in claimed_by(directory, slot):
        if partition in partitions:
            return partition
    if prefer in partitions and try_claim(directory, prefer, slot):
        return prefer
    me = os.getpid()
    deadline = time.monotonic() + grace
    while True:
        expired = time.monotonic() >= deadline
        waiting = False
        for partition in partitions:
            keeper = keepers.get(partition)
            if keeper is not None and keeper != me and not expired and is_alive(keeper):
                waiting = waiting or not (directory / str(int(partition))).exists()
                continue
            if try_claim(directory, partition, slot):
                return partition
        if not waiting:
            return None
        time.sleep(_POLL)


def is_alive(pid: int) -> bool:
    """Whether process ``pid`` exists on this host (a worker of a local master). A process of another
    user counts as alive; a reused pid too, which only makes a slot wait its grace period."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def try_claim(directory: Path, partition: int, slot: int) -> bool:
    """Claim ``partition`` for Spark task ``slot`` in ``directory`` (a batch's claims, shared by its
    tasks): True if the slot holds it now (also when it claimed it before), False if another slot
    does. A claim is a file ``<partition>`` holding the slot number, created atomically with its
    content (written aside, then hard-linked: ``link`` fails if the name exists)."""
    # Below the checkpoints dir, checked when its CheckpointStore was made: a batch's claims are
    # <checkpoints>/claims/<run>/<batch> or <checkpoints>/exchange/<id>/claims.
    ensure_dir(directory.parent.parent.parent, directory)
    target = directory / str(int(partition))
    try:
        return target.read_text() == str(slot)
    except FileNotFoundError:
        pass
    mine = directory / f".slot-{slot}-{os.getpid()}"
    mine.unlink(missing_ok=True)  # a stale one (pid reused); never written through a symlink
    with os.fdopen(open_nofollow(mine, os.O_WRONLY | os.O_CREAT | os.O_EXCL), "w") as handle:
        handle.write(str(slot))
    try:
        os.link(mine, target)
        return True
    except FileExistsError:
        return target.read_text() == str(slot)
    finally:
        mine.unlink(missing_ok=True)


def claimed_by(directory: Path, slot: int) -> list[int]:
    """The partitions Spark task ``slot`` claimed in ``directory`` (a retried attempt's), sorted."""
    if not directory.is_dir():
        return []
    found = []
    for entry in os.listdir(directory):
        if entry.isdigit():
            try:
                if (directory / entry).read_text() == str(slot):
                    found.append(int(entry))
            except FileNotFoundError:
                continue
    return sorted(found)


_worker_settled = False
"""whether this Python worker has frozen its imports (:func:`settle_worker`)"""


FREE_MEMORY_EVERY = 1.0
"""seconds between two :func:`return_free_memory` calls of one worker"""
_last_return = 0.0
_malloc_trim: Any = None


def return_free_memory() -> bool:
    """In a Spark Python worker, after a batch (:func:`checkin`): hand the C allocator's free memory back to the
    system, at most once per :data:`FREE_MEMORY_EVERY` (glibc's ``malloc_trim``). glibc keeps what a
    batch freed (its decoded input, a flushed RocksDB memtable) for reuse, so a worker that runs for
    weeks would otherwise keep the high-water mark of its batches. Returns whether it trimmed; a no-op
    outside a Spark task and where the C library has no ``malloc_trim``."""
    global _last_return, _malloc_trim
    now = time.monotonic()
    if now - _last_return < FREE_MEMORY_EVERY or task_context() is None:
        return False
    _last_return = now
    if _malloc_trim is None:
        try:
            _malloc_trim = ctypes.CDLL(None).malloc_trim
        except (OSError, AttributeError):  # not glibc
            _malloc_trim = False
    if _malloc_trim is False:
        return False
    _malloc_trim(0)
    return True


def settle_worker(job: JobConfig, tune: bool = True) -> bool:
    """Once per Spark Python worker, before its first localstate task opens anything: import what
    the job's instances need (task class, engine factories, changelog system, the input and output
    systems, and for a :class:`~localstate.core.task.BatchTask` the Arrow and numpy modules its
    batches are built with), collect, and move every object alive to the collector's permanent
    generation (``gc.freeze``). Returns whether this call froze.

    PySpark's worker loop runs a full ``gc.collect()`` after every task, before it reads the next
    one, so scanning the objects of pyspark's and localstate's modules sat on each micro-batch's
    critical path. Frozen objects are still freed by reference counting; only the objects alive now
    stop being scanned for cycles. :func:`checkout` and :func:`open_planned`, where every instance of
    a Spark task is opened (the native path's and the DataFrame path's), call it first, so no
    instance exists yet and state opened later stays collectable. Outside a Spark task (the driver,
    tests opening instances), and without ``tune`` (a job with ``[spark] worker_affinity = false``:
    plain tasks), nothing happens."""
    global _worker_settled
    if _worker_settled or not tune or task_context() is None:
        return False
    _worker_settled = True
    task_class = load_task_class(job.task)
    for store in job.stores.values():
        job.registry.engine_factory(store.engine)
    job.registry.changelog_system(job.changelog_system)
    for stream in (*job.inputs.values(), *job.outputs.values()):
        try:
            job.registry.load("streams", stream.system)
        except LocalStateError:
            pass  # an unknown or broken system fails where the stream is opened, with its typed error
    if issubclass(task_class, BatchTask):
        # Imported lazily by the batch path (columns, batches, compute), hence after the freeze: each
        # module's objects would be scanned by every collection after every task.
        for module in _BATCH_MODULES:
            importlib.import_module(module)
        # pyarrow imports pandas (when installed) the first time it converts Python values, to
        # recognise pandas objects: a large module tree, imported here rather than in the first batch.
        importlib.import_module("pyarrow").array([0])
    gc.collect()
    gc.freeze()
    return True


_BATCH_MODULES = ("numpy", "pyarrow", "pyarrow.compute", "pyarrow.json")
"""What a batch task's input decoding and batches import (see :func:`settle_worker`)."""


def task_context() -> Any:
    """The running Spark task's TaskContext, or None outside a Spark task."""
    return TaskContext.get()


def checkout(job: JobConfig, partition: int, run_id: str,
             make_sink: Callable[[], StreamSink] | None = None, *, tune: bool = True) -> Lease:
    """The open instance of ``partition`` for this task: the one this worker kept, if the driver
    committed its last batch, else a freshly opened (recovered) one, whose outputs go to
    ``make_sink()`` (default: the job's :class:`StreamSink`; a reused instance keeps its sink).
    ``tune``: settle the worker first (:func:`settle_worker`)."""
    global _kept
    settle_worker(job, tune)
    key = (run_id, str(job.state_dir), job.name, partition)
    with _mutex:
        lease, _kept = _kept, None
    if lease is not None:
        if lease.key == key and lease.is_current():
            lease.reused, lease.recoveries, lease.waited = True, [], 0.0
            return lease
        lease.close()  # another partition, or not committed: give it back / roll it back
    clock = {"changelog": 0.0, "outputs": 0.0}
    changelogs = _TimedChangelogs(open_changelog_system(job), clock)
    sink = _TimedSink(make_sink() if make_sink is not None else StreamSink(job), clock)
    instance = TaskInstance(job, partition, changelogs, sink, commit_policy=BatchCommits())
    try:
        waited = acquire_partition(instance.checkpoints, partition)
        recoveries = instance.open()
    except BaseException:
        sink.close()
        changelogs.close()
        instance.checkpoints.unlock(partition)
        raise
    return Lease(key, instance, changelogs, sink, clock, list(recoveries), False, waited)


def open_planned(job: JobConfig, plan: PartitionPlan) -> Lease:
    """Cluster mode: open ``plan``'s partition against the committed checkpoint the plan carries
    (:class:`~.cluster.PlannedCheckpoints`), with its stores under this host's local directory
    (:func:`~.cluster.executor_local_root`). No lock, no checkpoint file: the driver fences. Local
    state is validated against the checkpoint by recovery: reused if at its offset, rolled forward
    if behind, discarded and rebuilt if ahead, stale or damaged."""
    settle_worker(job, plan.tune_worker)
    committed = Checkpoint(**plan.committed) if plan.committed is not None else None
    checkpoints = PlannedCheckpoints(plan.partition, committed, plan.checkpoint_where)
    clock = {"changelog": 0.0, "outputs": 0.0}
    changelogs = _TimedChangelogs(open_changelog_system(job), clock)
    sink = _TimedSink(StreamSink(job), clock)
    instance = TaskInstance(job, plan.partition, changelogs, sink, commit_policy=BatchCommits(), checkpoints=checkpoints,  # type: ignore[arg-type]
                             local_root=executor_local_root(job), attempt=uuid.uuid4().hex)
    try:
        recoveries = instance.open()
    except BaseException:
        sink.close()
        changelogs.close()
        raise
    return Lease((plan.run_id, "cluster", job.name, plan.partition), instance, changelogs, sink, clock,
                 list(recoveries), False, 0.0)


def checkin(lease: Lease, prepared: Checkpoint | None, keep: bool) -> None:
    """Done with ``lease``: keep it open for the next batch (``keep`` and the batch prepared a
    checkpoint), else close it without committing."""
    global _kept, _watcher, _checked_in
    if not keep or prepared is None:
        lease.close()
        return_free_memory()
        return
    lease.prepared = prepared
    with _mutex:
        previous, _kept = _kept, lease
        _checked_in = time.monotonic()
        if _watcher is None or not _watcher.is_alive():
            _watcher = threading.Thread(target=_watch, name="localstate-lease-watcher", daemon=True)
            _watcher.start()
        _mutex.notify_all()
    if previous is not None:
        previous.close()
    return_free_memory()
