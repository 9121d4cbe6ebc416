"""One partition of an ``objectstore`` changelog: immutable delta objects, background snapshots, and
a chain adopted from (and reported to) the checkpoint. See :mod:`.chain` for the object layout."""

from __future__ import annotations

import concurrent.futures
import logging
import threading
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
import time
import uuid
from typing import Any, Iterable, Iterator

from localstate.changelog.framing import count_records, encode_into
from localstate.core.changelog import ChangelogPartition, ChangelogRecord, InFlightManifest, StoredHistory
from localstate.errors import ChangelogError, LocalStateError

from .chain import DELTA, Chain, ChainObject, decode_object, delta_name, missing_object, object_header, parse_name, \
    partition_prefix
from .compaction import SnapshotBuilder
from .compactor_pipe import CompactorProcess
from .storage import ObjectStore

__all__ = ["ObjectStoreChangelogPartition"]

log = logging.getLogger(__name__)

#: Objects fetched ahead of the one being decoded when a chain is read.
PREFETCH = 4
#: Where snapshots are built: a compactor subprocess per writer (off the task's GIL), or a thread of
#: the writer's own process (the fallback, and what a store that cannot be reopened elsewhere uses).
COMPACTORS = ("process", "thread")


def _nothing_in_flight() -> None:
    """The ``durable`` of an in-flight manifest whose objects are all written already."""


class ObjectStoreChangelogPartition(ChangelogPartition):
    """Appends buffer in memory; each :meth:`flush` writes them as ONE new delta object. The chain
    (snapshot + deltas) is what the checkpoint's manifest says (:meth:`adopt`), extended by this
    writer's flushes; once the chain holds ``snapshot_every`` deltas after its snapshot (counted from the
    chain, so a writer opened fresh for each batch snapshots too) a compacted snapshot of it is built and
    written in the background from the bytes this writer keeps (no reads from storage unless the
    chain was adopted from another host), and the next :meth:`manifest` names it instead of the
    deltas it covers. With ``compactor="process"`` the snapshot is built and written by a compactor
    subprocess (:mod:`.compactor`) fed each delta as it is flushed, so compaction does not share the
    task's GIL; if the child cannot start or dies, snapshots fall back to a thread of this process.
    Objects are never deleted here: only garbage collection against committed checkpoints deletes
    (:meth:`ObjectStoreChangelogSystem.compact_stream`), so a zombie writer can neither publish nor
    destroy anything the committed chain names."""

    def __init__(self, store: ObjectStore, stream: str, partition: int, *, snapshot_every: int = 10,
                 snapshot_min_records: int = 0, gc_grace: float = 600.0, writable: bool = True,
                 compactor: str = "process") -> None:
        if compactor not in COMPACTORS:
            raise ChangelogError(f"unknown compactor {compactor!r}", stream=stream, partition=partition,
                                 hint=f"use one of {', '.join(COMPACTORS)}")
        self.store = store
        self.stream = stream
        self.partition = partition
        self.prefix = partition_prefix(stream, partition)
        self.writer = uuid.uuid4().hex
        self.snapshot_every = snapshot_every
        self.snapshot_min_records = snapshot_min_records
        self.gc_grace = gc_grace
        self.writable = writable
        self._lock = threading.Lock()
        self._chain = Chain(stream, partition)
        self._buf = bytearray()
        self._next = 0
        self._bodies: dict[str, bytes] = {}  # object name -> record body this writer holds (no re-read)
        self._since_snapshot = 0
        self._snapshotting: Future[None] | None = None  # the snapshot being built, if any
        self._ready: tuple[ChainObject, bytes | None, float] | None = None  # snapshot, body, monotonic time written
        self._builder = SnapshotBuilder(store, stream, partition, self.writer)  # in-process snapshots
        self._epoch = 0  # bumped by adopt(): a snapshot built for an older chain is dropped
        # The compactor subprocess and the one thread that talks to it (deltas, then snapshot requests,
        # in order); started at the first snapshot. A store that cannot be reopened elsewhere, or a
        # child that failed, means in-process snapshots (on _snapshot_pool).
        self._use_child = compactor == "process" and store.spec is not None
        self._child: CompactorProcess | None = None
        self._feeder: ThreadPoolExecutor | None = None
        self._snapshot_pool: ThreadPoolExecutor | None = None
        self._children_cpu = 0.0
        self.snapshots_written = 0
        self.compactor_snapshots = 0  # snapshots built and written by the compactor subprocess
        self.snapshot_seconds = 0.0
        self.put_wait_seconds = 0.0  # time settle() spent waiting for delta PUTs (what a commit waits for)
        self._puts: ThreadPoolExecutor | None = None  # the delta PUT in flight (see flush)
        self._pending: Future[None] | None = None
        self._failed: LocalStateError | None = None  # a failed delta PUT: the chain has a gap until adopt()
        self._closed = False

    # ---------------------------------------------------------------- the chain

    def adopt(self, manifest: dict[str, Any] | None) -> None:
        chain = Chain(self.stream, self.partition) if manifest is None else \
            Chain.from_manifest(manifest, self.stream, self.partition)
        self._wait_for_put()  # a PUT of the chain being replaced: its outcome no longer matters
        with self._lock:
            self._epoch += 1
            self._pending = None
            self._failed = None
            self._chain = chain
            self._buf = bytearray()
            self._next = chain.end
            self._bodies = {}
            self._ready = None
            # Paced by the durable history, not by this writer's age: the deltas the committed chain
            # already holds after its snapshot count (on a cluster every batch opens a new writer).
            self._since_snapshot = len(chain.deltas or ())
            epoch = self._epoch
        if self._feeder is not None:
            self._feeder.submit(self._tell_child, "adopt", epoch, chain.end == 0)
        if self.writable and not self._closed and self._since_snapshot >= self.snapshot_every:
            # A chain already due for a snapshot (a writer opened fresh, as on a cluster every batch):
            # compact it now, in the background while the batch is processed; the manifest at the
            # end of the batch names the snapshot (it waits for it rather than name too long a tail).
            self._start_snapshot()

    def manifest(self) -> dict[str, Any]:
        """The chain up to the flushed end, every object of it durably written (waits for the delta
        PUT in flight; raises ChangelogError if it failed)."""
        self.settle()
        return self._flushed_manifest()

    def in_flight_manifest(self) -> InFlightManifest:
        """The chain up to the flushed end without waiting for the delta PUT in flight (the only
        object of it that may not be written yet: earlier PUTs were settled by this flush, and a
        snapshot is named only once written); ``durable()`` waits for that PUT. Raises the
        ChangelogError of a PUT that already failed."""
        if self._failed is not None:
            self.settle()  # raises it
        manifest = self._flushed_manifest()
        pending = self._pending
        if pending is None:
            return InFlightManifest(manifest, _nothing_in_flight)
        return InFlightManifest(manifest, pending.result)  # the PUT's own error is a typed ChangelogError

    def _flushed_manifest(self) -> dict[str, Any]:
        self._install_snapshot()
        if self._buf:
            raise ChangelogError("manifest() with unflushed records", stream=self.stream, partition=self.partition,
                                 hint="flush the changelog before preparing a checkpoint (the runtime does)")
        if len(self._chain.deltas or ()) > self.snapshot_every and self.writable and not self._closed:
            self._catch_up_snapshot()
        return self._chain.to_manifest()

    def _catch_up_snapshot(self) -> None:
        """Bound the chain a manifest names to ``snapshot_every`` deltas after its snapshot: wait for
        the snapshot being built (started at the flush or the adopt that made the chain due), or
        build one now if none is running. A snapshot that fails (logged) or that
        ``snapshot_min_records`` holds back leaves the longer chain: a snapshot is an optimisation."""
        for _attempt in range(2):
            running = self._snapshotting
            if running is None or running.done():
                self._start_snapshot()
                running = self._snapshotting
            if running is not None:
                concurrent.futures.wait([running])
            self._install_snapshot()
            if running is None or len(self._chain.deltas or ()) <= self.snapshot_every:
                return

    def stored_history(self) -> StoredHistory | None:
        """Every delta and snapshot object under this partition's prefix, committed or not (one
        listing; the runtime asks only when the task partition has no checkpoint, see
        :class:`~localstate.core.changelog.ListedHistory`). None if there is none."""
        objects = [(info, parse_name(info.key[len(self.prefix) + 1:])) for info in self.store.list(self.prefix)]
        found = [(info, parsed) for info, parsed in objects if parsed is not None]
        if not found:
            return None
        return StoredHistory(stream=self.stream, objects=len(found), size=sum(info.size for info, _ in found),
                             end=max(parsed[2] for _, parsed in found), where=self.store.where(self.prefix))

    def chain(self) -> Chain:
        """The current chain (what :meth:`manifest` describes)."""
        return self._chain

    def compaction_horizon(self) -> int:
        """Reading below the snapshot's end misses the deletes the snapshot dropped: local state older
        than it is rebuilt (see :mod:`localstate.runtime.partition.recovery`)."""
        snapshot = self._chain.snapshot
        return snapshot.end if snapshot is not None else 0

    # ---------------------------------------------------------------- writing

    def append(self, key: bytes, value: bytes | None) -> None:
        self.append_many(((key, value),))

    def _check_writable(self) -> None:
        if self._closed:
            raise ChangelogError("changelog partition is closed", stream=self.stream, partition=self.partition,
                                 hint="open the partition again")
        if not self.writable:
            raise ChangelogError("changelog partition was opened read-only", stream=self.stream,
                                 partition=self.partition, hint="use ObjectStoreChangelogSystem.partition() to write")

    def append_many(self, records: Iterable[tuple[bytes, bytes | None]]) -> None:
        if self._closed or not self.writable:
            self._check_writable()
        buf = self._buf
        try:
            self._next = encode_into(buf, records, self._next, int(time.time() * 1000))
        except Exception as exc:  # struct.error, TypeError, OverflowError: a record that is not bytes / too long
            # A bad record fails before any byte of it is buffered: the records before it stay, whole.
            self._next = self._chain.end + count_records(buf)
            raise ChangelogError(f"cannot append record: {exc}", stream=self.stream, partition=self.partition,
                                 offset=self._next, hint="keys and values must be bytes; keys < 4 GiB, "
                                 "values < 2 GiB") from exc

    def end_offset(self) -> int:
        return self._next

    def flush(self) -> int:
        """Seal the buffered records as one new delta object and start writing it in the background
        (nothing if none are buffered). The caller's local write (the store's backend batch), the
        other stores' PUTs and the output delivery overlap with it; :meth:`manifest` waits for it, so
        a checkpoint never names an object that is not written. At most one PUT is in flight per
        partition: a flush first waits for the previous one.

        A failed PUT fails this partition (this and every later flush and manifest raise
        ChangelogError) until :meth:`adopt` sets a committed chain again: the chain would have a gap.
        Local state that moved past the last checkpoint meanwhile is rolled back by recovery (it is
        ahead of the checkpoint's offset, so it is rebuilt from the committed chain)."""
        if self._closed or not self.writable:
            self._check_writable()
        self.settle()
        if not self._buf:
            return self._next
        start, end = self._chain.end, self._next
        name = delta_name(start, end, self.writer)
        body = bytes(self._buf)
        data = object_header(DELTA, self.writer, start, end, end - start) + body
        self._buf = bytearray()
        self._pending = self._put_pool().submit(self._put_delta, f"{self.prefix}/{name}", data)
        delta = ChainObject(name, DELTA, start, end, end - start, len(data), self.writer)
        self._chain.deltas.append(delta)
        self._bodies[name] = body
        if self._feeder is not None and self._use_child:
            self._feeder.submit(self._tell_child, "feed", self._epoch, delta, body)
        self._since_snapshot += 1
        if self._since_snapshot >= self.snapshot_every:
            if self._since_snapshot >= 2 * self.snapshot_every and self._snapshotting is not None:
                # Snapshots fall behind the writer: wait for the running one rather than let the tail
                # (hence a move's restore time) grow without bound.
                concurrent.futures.wait([self._snapshotting])
                self._install_snapshot()
            self._start_snapshot()
        return end

    def _put_delta(self, key: str, data: bytes) -> None:
        """PUT thread: write one delta object; any failure is a ChangelogError naming the object."""
        try:
            self.store.put(key, data)
        except LocalStateError as exc:
            raise ChangelogError(exc.message, stream=self.stream, partition=self.partition,
                                 path=exc.context.get("path", self.store.where(key)), hint=exc.hint) from exc
        except Exception as exc:  # noqa: BLE001 - anything else from the storage client: typed here
            raise ChangelogError(f"writing delta object {self.store.where(key)} failed: {type(exc).__name__}: "
                                 f"{exc}", stream=self.stream, partition=self.partition, path=self.store.where(key),
                                 hint="check that the storage is reachable; the commit failed and is retried "
                                      "from the last checkpoint") from exc

    def _put_pool(self) -> ThreadPoolExecutor:
        if self._puts is None:
            self._puts = ThreadPoolExecutor(1, thread_name_prefix=f"localstate-put-{self.stream}-{self.partition}")
        return self._puts

    def settle(self) -> None:
        """Wait for the delta PUT in flight, if any: once this returns, every flushed record is durably
        written. Raises the ChangelogError of a failed PUT (then, and at every later call, until
        :meth:`adopt`)."""
        pending, self._pending = self._pending, None
        if pending is not None:
            waited = time.perf_counter()
            try:
                pending.result()
            except LocalStateError as exc:  # typed by _put_delta
                self._failed = exc
            self.put_wait_seconds += time.perf_counter() - waited
        if self._failed is not None:
            raise ChangelogError(f"a delta object of this partition could not be written ({self._failed.message}); "
                                 "nothing after the last checkpoint can be committed", stream=self.stream,
                                 partition=self.partition, path=self._failed.context.get("path"),
                                 hint="the commit failed: reopen the partition from the last checkpoint (the runtime "
                                      "retries the batch) once the storage is reachable") from self._failed

    def _start_snapshot(self) -> None:
        """Compact the current chain into a snapshot in the background, unless one is running or
        waiting to be named. A manifest never names more than ``snapshot_every`` deltas after its
        snapshot: :meth:`_flushed_manifest` waits for (or builds) the snapshot that would exceed it."""
        if self._snapshotting is not None and not self._snapshotting.done():
            return
        if self._ready is not None or not self._chain.deltas:
            return
        if sum(delta.records for delta in self._chain.deltas) < self.snapshot_min_records:
            return
        self._since_snapshot = 0
        objects = self._chain.objects()
        bodies = {item.name: self._bodies[item.name] for item in objects if item.name in self._bodies}
        if self._use_child:
            if self._feeder is None:
                self._feeder = ThreadPoolExecutor(1, thread_name_prefix=f"localstate-compactor-{self.stream}-"
                                                                        f"{self.partition}")
            pool = self._feeder
        else:
            if self._snapshot_pool is None:
                self._snapshot_pool = ThreadPoolExecutor(1, thread_name_prefix=f"localstate-snapshot-{self.stream}-"
                                                                               f"{self.partition}")
            pool = self._snapshot_pool
        self._snapshotting = pool.submit(self._snapshot, objects, bodies, self._epoch)

    def _snapshot(self, objects: list[ChainObject], bodies: dict[str, bytes], epoch: int) -> None:
        """Background: compact ``objects`` (``bodies``: the record bodies this writer holds) into one
        snapshot object and write it, in the compactor subprocess when there is one, else here. A
        failure is logged: the deltas stay in the chain and a later snapshot retries."""
        started = time.perf_counter()
        try:
            snapshot = self._snapshot_in_child(objects, bodies, epoch) if self._use_child else None
            body: bytes | None = None
            if snapshot is None:
                if self._closed:  # nothing is written for a closed writer (no manifest could name it)
                    return
                snapshot, body = self._builder.build(objects, epoch, bodies)
            else:
                self.compactor_snapshots += 1
        except LocalStateError as exc:
            if not self._closed:  # closing kills a snapshot in flight on purpose
                log.warning("changelog %s partition %d: background snapshot failed (%s); the deltas stay in the "
                            "chain and a later snapshot retries", self.stream, self.partition, exc.message)
            return
        with self._lock:
            if epoch == self._epoch:
                self._ready = (snapshot, body, time.monotonic())
        self.snapshot_seconds += time.perf_counter() - started

    def _snapshot_in_child(self, objects: list[ChainObject], bodies: dict[str, bytes],
                           epoch: int) -> ChainObject | None:
        """The snapshot built and written by the compactor subprocess (started here, on the feeder
        thread, the first time: it is handed the deltas this writer holds), or None if there is no
        working child (then the caller builds it in-process). Raises the child's storage error."""
        child = self._child
        try:
            if child is None:
                child = CompactorProcess(self.store.spec or {}, self.stream, self.partition, self.writer)
                with self._lock:
                    started, self._child = not self._closed, child
                if not started:  # closed meanwhile: close() may have missed this child
                    self._stop_child()
                    return None
                child.adopt(epoch, False)
                for item in objects:
                    if item.kind == DELTA and item.name in bodies:
                        child.feed(epoch, item, bodies[item.name])
            return child.snapshot(objects, epoch)
        except ChangelogError as exc:
            if child is not None and child.alive:
                raise  # the child is fine, the storage failed: a later snapshot retries
            self._child_failed(exc)
            if self._closed:
                raise
            return None
        except OSError as exc:  # the child could not be started at all
            self._child_failed(exc)
            return None

    def _child_failed(self, exc: BaseException) -> None:
        """Stop using the compactor subprocess: snapshots are built in-process from now on."""
        message = exc.message if isinstance(exc, LocalStateError) else f"{type(exc).__name__}: {exc}"
        if not self._closed:
            log.warning("changelog %s partition %d: the compactor subprocess failed (%s); snapshots are built "
                        "in-process from now on (nothing is lost: the deltas stay in the chain)", self.stream,
                        self.partition, message)
        self._use_child = False
        self._stop_child()

    def _tell_child(self, what: str, *args: Any) -> None:
        """Feeder thread: hand the child an adopted chain or a flushed delta (if it runs)."""
        child = self._child
        if child is None or not self._use_child:
            return
        try:
            if what == "adopt":
                child.adopt(*args)
            else:
                child.feed(*args)
        except ChangelogError as exc:
            self._child_failed(exc)

    def _stop_child(self) -> None:
        with self._lock:
            child, self._child = self._child, None
        if child is not None:
            child.close()
            self._children_cpu += child.cpu_seconds

    @property
    def compactor_cpu_seconds(self) -> float:
        """CPU time (user + system) of this writer's compactor subprocesses that have exited."""
        return self._children_cpu

    @property
    def compactor_pid(self) -> int | None:
        """The running compactor subprocess's pid, if any."""
        child = self._child
        return child.pid if child is not None else None

    def _install_snapshot(self) -> None:
        """Put a completed snapshot in the chain in place of the objects it covers."""
        with self._lock:
            ready, self._ready = self._ready, None
        if ready is None:
            return
        snapshot, body, written = ready
        if time.monotonic() - written > self.gc_grace / 2:
            # Named by no checkpoint yet, garbage collection may delete it once it is gc_grace old:
            # too late to name it safely. A later snapshot takes its place.
            log.info("changelog %s partition %d: snapshot %s waited too long for a commit; not used",
                     self.stream, self.partition, snapshot.name)
            return
        chain = self._chain
        chain.snapshot = snapshot
        chain.deltas = [delta for delta in chain.deltas if delta.start >= snapshot.end]
        kept = {delta.name for delta in chain.deltas}
        self._bodies = {name: b for name, b in self._bodies.items() if name in kept}
        if body is not None:  # a snapshot the compactor subprocess built is read back from storage if needed
            self._bodies[snapshot.name] = body
        self.snapshots_written += 1

    def wait_for_snapshot(self) -> None:
        """Block until a running background snapshot is done (tests, benchmarks, shutdown)."""
        running = self._snapshotting
        if running is not None:
            concurrent.futures.wait([running])

    # ---------------------------------------------------------------- reading

    def _object(self, item: ChainObject) -> bytes:
        """The whole object (header + records): from this writer's memory, else from storage."""
        body = self._bodies.get(item.name)
        if body is not None:
            return object_header(item.kind, item.writer, item.start, item.end, item.records) + body
        key = f"{self.prefix}/{item.name}"
        try:
            return self.store.get(key)
        except FileNotFoundError:
            raise missing_object(self.store.where(key), item, stream=self.stream, partition=self.partition) from None

    def read(self, start: int = 0, end: int | None = None) -> Iterator[ChangelogRecord]:
        for batch in self.read_batches(start, end):
            yield from batch

    def read_batches(self, start: int = 0, end: int | None = None) -> Iterator[list[ChangelogRecord]]:
        """One verified list per chain object overlapping ``[start, end)``. Up to ``PREFETCH`` objects
        are fetched ahead, in parallel: a restore waits for storage latency once, not per object."""
        stop = self._chain.end if end is None else min(end, self._chain.end)
        items = [item for item in self._chain.objects() if item.end > start and item.start < stop]
        if not items:
            return
        pool = ThreadPoolExecutor(max_workers=min(PREFETCH, len(items)),
                                  thread_name_prefix=f"localstate-fetch-{self.stream}-{self.partition}")
        try:
            pending: deque[Future[bytes]] = deque()
            upcoming = iter(items)
            for item in items:
                while len(pending) < PREFETCH:
                    following = next(upcoming, None)
                    if following is None:
                        break
                    pending.append(pool.submit(self._object, following))
                data = pending.popleft().result()
                where = self.store.where(f"{self.prefix}/{item.name}")
                records = decode_object(data, item, stream=self.stream, partition=self.partition, where=where)
                if records and (records[0].offset < start or records[-1].offset >= stop):
                    records = [r for r in records if start <= r.offset < stop]
                if records:
                    yield records
        finally:
            pool.shutdown(wait=False, cancel_futures=True)

    def _wait_for_put(self) -> None:
        """Let the PUT in flight finish, without raising its error."""
        pending = self._pending
        if pending is not None:
            concurrent.futures.wait([pending])

    def close(self) -> None:
        """Wait for the delta PUT in flight (a failure is only logged: nothing names the object
        before a manifest), kill the compactor subprocess or wait for an in-process snapshot (a
        snapshot in flight is never named), then drop the buffers. Nothing of this writer is written
        after close returns."""
        with self._lock:
            self._closed = True
        self._stop_child()
        # The feeder's calls to the killed child end at once; an in-process snapshot cannot be
        # killed: let it end here, so that nothing of this writer is written after close() returns
        # (an unnamed object would only wait for garbage collection).
        for pool in (self._feeder, self._snapshot_pool):
            if pool is not None:
                pool.shutdown(wait=True, cancel_futures=True)
        try:
            self.settle()
        except ChangelogError as exc:
            log.warning("changelog %s partition %d: %s", self.stream, self.partition, exc.message)
        if self._puts is not None:
            self._puts.shutdown(wait=True)
            self._puts = None
        self._buf = bytearray()
        self._bodies = {}

