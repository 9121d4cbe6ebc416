"""The time of one task partition: its watermark, its processing clock, and its timers.

:class:`PartitionTime` is the partition's :class:`~localstate.core.time.Timers` (``context.timers``)
and the :class:`~localstate.core.time.TimeSource` of its stores (``StoreContext.time``).

*Watermark*: the largest event timestamp the partition has seen minus ``[time] allowed_lateness``,
never below the watermark of the checkpoint it was opened from (so it never goes back across
restarts either). The feed loop raises :attr:`PartitionTime.high` after each record (a batch task:
after each batch), so the task sees the watermark from before the record (or batch) it processes.

*Timers* are state: each is an entry of the logged kv store :data:`~localstate.core.time.TIMER_STORE`
(raw bytes, recovered, flushed and checkpointed with the other stores), keyed (see
:mod:`.timer_entries`)

    domain (1 byte) | timestamp (8 bytes, order-preserving) | namespace (length byte, UTF-8) | key

so a range scan of a domain returns its timers in timestamp order across every namespace, and
registering the same (domain, namespace, key, timestamp) twice writes the same entry (deduplicated,
as Flink). The earliest timestamp of each domain is cached, so a batch boundary with nothing due
costs two comparisons. Entries in the layout before namespaces are rewritten into namespace ``""``
when the store is attached (they commit with the next commit).

*Namespaces* (:class:`TimerNamespace`, Flink's per-(key, namespace) timers): the task's own timers
(``context.timers.register_*``) are namespace ``""``, keys encoded by ``[time] timer_key_serde``, fired
through the task's ``on_timer``; ``context.timers.namespace(name, on_fire, key_serde)`` opens another
(a windowed aggregation opens one), with its own key serde, fired through its own ``on_fire``. Every
namespace shares its domain's one firing order.

*Firing* (:meth:`PartitionTime.fire`): every event-time timer with timestamp <= watermark, then
every processing-time timer with timestamp <= the clock (read once per firing), each in timestamp
order; a timer registered while firing that is due already fires in the same round. Due timers are
read in chunks of :data:`SCAN_CHUNK` (one backend call each, keys and timestamps decoded per chunk);
a chunk's timers are deleted from the store in one batch just before the first of them fires (one
registered again while firing is deleted again as it fires; those an exception kept from firing are
put back): the deletions and the outputs ``on_timer`` sends go into the same commit, so a timer
fires exactly once across crashes (a crash before the commit rolls both back, and the timer fires
again after recovery, its earlier outputs trimmed with the rest).
"""

from __future__ import annotations

import heapq
import math
from typing import Any, Callable

from localstate.core.codecs import FAST_ERRORS
from localstate.core.text import a
from localstate.core.config import JobConfig
from localstate.core.serdes import Serde
from localstate.core.time import EVENT_TIME, PROCESSING_TIME, TIMER_STORE
from localstate.core.tracebacks import raise_task_error
from localstate.errors import ConfigError, InvalidValueError
from localstate.runtime.partition.timer_entries import (ALL, DOMAIN_BYTE, OWN, PREFIX, SIGN, UNDECODED, KeyCodec,
                                                        NamespaceTable, after, decode_timestamp, decode_timestamps,
                                                        encode_timestamp, first_item, json_str, migrate_old_entries,
                                                        namespace_codec, namespace_header, pack_f64, pack_head,
                                                        pack_u64, split_entry, unpack_f64, unpack_u64)

__all__ = ["PartitionTime", "TimerNamespace", "encode_timestamp", "decode_timestamp", "SCAN_CHUNK"]

SCAN_CHUNK = 16384
"""Due timers read from the store per scan while firing (bounded memory for a million due timers)."""


class TimerNamespace:
    """A namespace of a partition's timers (:class:`~localstate.core.time.TimerNamespace`): its keys
    encoded by its own serde, its due timers fired through its ``on_fire(key, timestamp, collector,
    coordinator)``, in its domain's one order with every other namespace's."""

    __slots__ = ("name", "header", "length", "name_bytes", "codec", "on_fire", "spec", "usable", "_time")

    def __init__(self, time: "PartitionTime", name: str, header: bytes, codec: KeyCodec | None,
                 on_fire: Callable[..., None] | None, spec: Any, usable: bool) -> None:
        self.name = name
        self.header = header
        self.length, self.name_bytes = header[0], header[1:]
        self.codec = codec
        self.on_fire = on_fire
        self.spec = spec
        """the key serde as the task gave it (a second open must give the same)"""
        self.usable = usable
        """registering may go ahead (the task's own namespace: timers kept and ``on_timer`` defined)"""
        self._time = time

    def register_event_time(self, key: Any, timestamp: float) -> None:
        self._time._register(EVENT_TIME, key, timestamp, self)

    def register_processing_time(self, key: Any, timestamp: float) -> None:
        self._time._register(PROCESSING_TIME, key, timestamp, self)

    def delete_event_time(self, key: Any, timestamp: float) -> None:
        self._time._delete(EVENT_TIME, key, timestamp, self)

    def delete_processing_time(self, key: Any, timestamp: float) -> None:
        self._time._delete(PROCESSING_TIME, key, timestamp, self)

    def __repr__(self) -> str:
        return f"TimerNamespace({self.name!r})"


class _Round:
    """A firing in progress in one domain (:meth:`PartitionTime.fire`, see the module docstring): the
    due timers of the current scan (in key order), and a heap of the due timers registered while firing
    below the scan's end (:meth:`PartitionTime._register` adds them while :meth:`fire` runs)."""

    __slots__ = ("domain", "now", "partition", "last", "heap", "pending", "deleted", "ahead")

    def __init__(self, domain: str, now: float, partition: int) -> None:
        self.domain = domain
        self.now = now
        self.partition = partition
        self.last = b""
        """the greatest store key the current scan covers: a due timer registered at or below it joins
        the heap (the next scan reads those above it)"""
        self.heap: list[bytes] = []
        self.pending: set[bytes] = set()
        """registered while firing and not fired yet (the heap may hold deleted ones: skipped)"""
        self.deleted: set[bytes] = set()
        """deleted while firing (a scanned timer among them is skipped)"""
        self.ahead = False
        """a timer above the scan's end was registered or deleted while firing (the next scan, which
        reads the backend, must see it: the store is flushed first)"""

    def fire(self, store: Any, namespaces: NamespaceTable, on_timer: Callable[..., None], collector: Any,
             coordinator: Any, failed: Callable[[BaseException, Any, float], None],
             before_each: Callable[[], None] | None) -> int:
        """Fire every timer of the domain due at :attr:`now` from ``store`` (the timer store), each
        through its namespace's handler (see :meth:`PartitionTime.fire`). Returns how many fired."""
        prefix = PREFIX[self.domain]
        end = prefix + after(encode_timestamp(self.now))
        heap, pending, deleted = self.heap, self.pending, self.deleted
        pop, delete, delete_all = heapq.heappop, store.delete, store.delete_all
        start = prefix
        fired = 0
        # Scans read the backend directly (the cheapest way through a million timers): the store is
        # flushed first, so the backend holds every timer registered so far. Flushing before the
        # commit is as safe as any spill: a crash before the checkpoint rolls the store back.
        store.flush()
        backend = store.backend
        while True:
            scanned = list(map(first_item, backend.scan(start, end, SCAN_CHUNK)))
            exhausted = len(scanned) < SCAN_CHUNK
            self.last = end if exhausted else scanned[-1]
            # who fires each timer, resolved before anything is deleted (a namespace nobody opened
            # is a ConfigError that leaves the store as it was)
            handlers, keys = namespaces.chunk(scanned, on_timer)
            stamps = decode_timestamps(scanned)
            # The chunk's deletions in one batch, before any of its timers fires: all land in the
            # same commit as the outputs either way. A timer re-registered while firing (pending)
            # is deleted again as it fires; if the round stops early (an exception) the timers
            # not fired yet are put back (below).
            delete_all(scanned)
            index, count = 0, len(scanned)
            try:
                # Two sources in key order: the scan, and the heap of timers registered while firing.
                while True:
                    if heap and (index == count or heap[0] < scanned[index]):
                        entry = pop(heap)
                        if entry not in pending:
                            continue  # deleted after it was registered
                        pending.discard(entry)
                        delete(entry)
                        key = UNDECODED
                        handler = namespaces.handler(entry, on_timer)
                        (bits,) = unpack_u64(entry[1:9])  # decode_timestamp, inline
                        timestamp = unpack_f64(pack_u64(bits & ~SIGN if bits & SIGN else bits ^ ALL))[0]
                    elif index < count:
                        entry = scanned[index]
                        key = keys[index]
                        handler = handlers[index]
                        timestamp = stamps[index]
                        index += 1
                        if deleted and entry in deleted:
                            continue
                        if pending and entry in pending:  # re-registered while firing: fires once, from here
                            pending.discard(entry)
                            delete(entry)
                    else:
                        break
                    if before_each is not None:
                        before_each()
                    if key is UNDECODED:
                        key = namespaces.decode(entry)
                    try:
                        handler(key, timestamp, collector, coordinator)
                    except (Exception, SystemExit) as exc:
                        if handler is on_timer:
                            failed(exc, key, timestamp)
                        else:
                            self._namespace_failed(exc, entry, key, timestamp)
                        raise
                    fired += 1
            except BaseException:
                unfired = [entry for entry in scanned[index:] if entry not in deleted]
                if unfired:
                    store.put_many(unfired, [b""] * len(unfired))
                raise
            if exhausted:
                break
            start = self.last + b"\x00"
            if self.ahead:
                store.flush()
                self.ahead = False
            deleted.clear()  # below the next scan's start
        return fired

    def _namespace_failed(self, exc: BaseException, entry: bytes, key: Any, timestamp: float) -> None:
        """A namespace's ``on_fire`` raised ``exc`` for ``key`` at ``timestamp``: a TaskError naming it."""
        name = split_entry(entry)[2]
        raise_task_error(exc, f"on_fire() of timer namespace {name!r}", partition=self.partition,
                         hint=f"fix the on_fire of timer namespace {name!r} (it failed for key {key!r:.200} at "
                              f"{timestamp!r}); state and timers are rolled back to the last commit on restart")


class PartitionTime:
    """The watermark, the processing clock and the timers of one task partition.

    ``store`` (:meth:`attach`) is the timer store's engine; without it (a job without ``[time]
    timers = true``) reading time works and registering a timer is a ConfigError naming the key to
    add. Not thread safe: the partition's one driving thread uses it."""

    def __init__(self, job: JobConfig, partition: int, clock: Callable[[], float],
                 watermark: float | None = None) -> None:
        self._job = job
        self._partition = partition
        self._clock = clock
        self._lateness = job.time.allowed_lateness
        self._forbid_past = job.time.past_timers == "error"
        self._floor = watermark
        """the watermark of the checkpoint opened from (or moved to by :meth:`advance_watermark`)"""
        self.high = -math.inf
        """the largest event timestamp fed since open (the feed loop raises it)"""
        self._store: Any = None
        self._namespaces = NamespaceTable(partition)
        self._own = TimerNamespace(self, "", OWN, None, None, None, usable=False)
        """the task's own timers (namespace ``""``), usable once attached if the task defines on_timer"""
        self._earliest: dict[str, float | None] = {EVENT_TIME: None, PROCESSING_TIME: None}
        self._round: _Round | None = None
        self._firing_domain: str | None = None
        self.migrated = 0
        """timers :meth:`attach` rewrote from the layout before namespaces"""

    # -- time ------------------------------------------------------------------------------------
    def processing_time(self) -> float:
        return self._clock()

    @property
    def watermark(self) -> float | None:
        high = self.high - self._lateness
        floor = self._floor
        if floor is not None and not high > floor:
            return floor
        return high if high != -math.inf else None

    def observe(self, timestamp: float | None) -> None:
        """A record with event time ``timestamp`` was fed (None: it has none)."""
        if timestamp is not None and timestamp > self.high:
            self.high = timestamp

    def advance_watermark(self, to: float) -> None:
        """Move the watermark to ``to`` (ignored unless ahead): a test driver's explicit event time."""
        current = self.watermark
        if current is None or to > current:
            self._floor = float(to)

    # -- timers ----------------------------------------------------------------------------------
    def attach(self, store: Any, key_serde: Serde, task_fires: bool) -> None:
        """Keep timers in ``store`` (the recovered timer store; entries of the layout before
        namespaces are migrated now), the task's own keys encoded by ``key_serde``; ``task_fires``:
        the task overrides ``on_timer`` (registering its own timers is refused otherwise)."""
        self._store = store
        self.migrated = migrate_old_entries(store)
        codec = KeyCodec(key_serde, self._job.time.timer_key_serde,
                         "set [time] timer_key_serde to a serde that encodes the task's keys", self._partition)
        self._own = TimerNamespace(self, "", OWN, codec, None, None, usable=task_fires)
        self._namespaces.add(self._own, own=True, fires=task_fires)
        for domain in PREFIX:
            self._earliest[domain] = self._first(domain)

    def namespace(self, name: str, on_fire: Callable[[Any, float, Any, Any], None],
                  key_serde: Serde | str | None = None) -> TimerNamespace:
        """The timer namespace ``name`` (see :meth:`localstate.core.time.Timers.namespace`); opening
        it again with the same ``on_fire`` and ``key_serde`` returns the same one."""
        header = namespace_header(name, self._partition)
        if self._store is None:
            raise ConfigError.at("time.timers", f"the task of partition {self._partition} opened timer namespace "
                                 f"{name!r}, but job {self._job.name!r} keeps no timers",
                                 hint="add a [time] table with timers = true to the job config")
        if not callable(on_fire):
            raise ConfigError.at("job.task", f"partition {self._partition}: timer namespace {name!r} needs a callable "
                                 f"on_fire, got {type(on_fire).__name__}",
                                 hint="pass on_fire(key, timestamp, collector, coordinator)")
        spec = "json" if key_serde is None else key_serde
        opened = self._namespaces.get(header)
        if opened is not None:
            if opened.on_fire == on_fire and opened.spec == spec:
                return opened
            raise ConfigError.at("job.task", f"partition {self._partition}: timer namespace {name!r} is open already, "
                                 "with another on_fire or key serde",
                                 hint="open each timer namespace once per partition (in init()); two "
                                      "WindowedAggregations need a store each")
        codec = namespace_codec(self._job, self._partition, name, spec)
        namespace = TimerNamespace(self, name, header, codec, on_fire, spec, usable=True)
        self._namespaces.add(namespace)
        return namespace

    @property
    def enabled(self) -> bool:
        return self._store is not None

    @property
    def firing_domain(self) -> str | None:
        return self._firing_domain

    @property
    def next_processing_timer(self) -> float | None:
        """The earliest processing-time timer pending (possibly one deleted since: never later)."""
        return self._earliest[PROCESSING_TIME]

    def register_event_time(self, key: Any, timestamp: float) -> None:
        self._register(EVENT_TIME, key, timestamp, self._own)

    def register_processing_time(self, key: Any, timestamp: float) -> None:
        self._register(PROCESSING_TIME, key, timestamp, self._own)

    def delete_event_time(self, key: Any, timestamp: float) -> None:
        self._delete(EVENT_TIME, key, timestamp, self._own)

    def delete_processing_time(self, key: Any, timestamp: float) -> None:
        self._delete(PROCESSING_TIME, key, timestamp, self._own)

    def _check_usable(self, domain: str) -> None:
        """Raise why the task cannot register its own timers (none kept, or no ``on_timer``)."""
        if self._store is None:
            raise ConfigError.at("time.timers", f"the task of partition {self._partition} registered "
                                 f"{a(domain)}-time timer, but job {self._job.name!r} keeps no timers",
                                 hint="add a [time] table with timers = true to the job config")
        raise ConfigError.at("job.task", "the task registers timers but does not define on_timer(); a timer "
                             "that fires would have nowhere to go",
                             hint="override on_timer(self, key, timestamp, collector, coordinator) in the task")

    def _entry(self, domain: str, key: Any, timestamp: Any, namespace: TimerNamespace) -> tuple[float, bytes]:
        """``(timestamp as float, store key)`` of a timer; typed errors for what cannot be one."""
        if not namespace.usable:
            self._check_usable(domain)
        if timestamp.__class__ is not float or timestamp - timestamp != 0.0:  # not a finite float: look closer
            if isinstance(timestamp, bool) or not isinstance(timestamp, (int, float)) or not math.isfinite(timestamp):
                where = f" in timer namespace {namespace.name!r}" if namespace.name else ""
                raise InvalidValueError(f"{a(domain)}-time timer needs a finite timestamp (seconds since the epoch), "
                                        f"got {timestamp!r} for key {key!r}{where}", store=TIMER_STORE,
                                        partition=self._partition,
                                        hint="pass a number such as envelope.timestamp + 60")
            timestamp = float(timestamp)
        codec = namespace.codec
        try:
            if key.__class__ is str and codec.json_keys:  # type: ignore[union-attr]  # the common key, without the encoder's frames
                kb = json_str(key).encode()
            else:
                kb = codec.encode(key)  # type: ignore[union-attr]
        except FAST_ERRORS:
            kb = codec.slow_key(key)  # type: ignore[union-attr]
        (bits,) = unpack_u64(pack_f64(timestamp + 0.0))  # encode_timestamp, inline: the per-timer path
        return timestamp, pack_head(DOMAIN_BYTE[domain], bits ^ ALL if bits & SIGN else bits | SIGN,
                                    namespace.length) + namespace.name_bytes + kb

    def _register(self, domain: str, key: Any, timestamp: Any, namespace: TimerNamespace) -> None:  # noqa: C901
        timestamp, entry = self._entry(domain, key, timestamp, namespace)
        if self._forbid_past:
            now = self._clock() if domain == PROCESSING_TIME else self.watermark
            if now is not None and timestamp < now:
                raise ConfigError.at("time.past_timers", f"partition {self._partition}: {a(domain)}-time timer for "
                                     f"key {key!r} at {timestamp!r} is before the current {domain} time {now!r}, "
                                     f"and past_timers = \"error\"",
                                     hint="register timers at or after the current time, or set [time] "
                                          "past_timers = \"fire\" to fire them at the next firing point")
        self._store.put(entry, b"")
        earliest = self._earliest[domain]
        if earliest is None or timestamp < earliest:
            self._earliest[domain] = timestamp
        firing = self._round
        if firing is not None and entry > firing.last:
            firing.ahead = True
        elif firing is not None and firing.domain == domain and timestamp <= firing.now:
            firing.deleted.discard(entry)
            if entry not in firing.pending:
                heapq.heappush(firing.heap, entry)  # due already, and below what the next scan reads
                firing.pending.add(entry)

    def _delete(self, domain: str, key: Any, timestamp: Any, namespace: TimerNamespace) -> None:
        _timestamp, entry = self._entry(domain, key, timestamp, namespace)
        self._store.delete(entry)
        firing = self._round
        if firing is not None and entry > firing.last:
            firing.ahead = True
        elif firing is not None and firing.domain == domain:
            firing.pending.discard(entry)
            firing.deleted.add(entry)

    def _first(self, domain: str) -> float | None:
        """The earliest timer of ``domain`` in the store, or None."""
        prefix = PREFIX[domain]
        with self._store.range(prefix, bytes([prefix[0] + 1])) as entries:
            for entry, _ in entries:
                return decode_timestamp(entry[1:9])
        return None

    # -- firing ----------------------------------------------------------------------------------
    def due(self) -> bool:
        """Whether a timer may be due (cheap: the cached earliest timestamps)."""
        if self._store is None:
            return False
        event, processing = self._earliest[EVENT_TIME], self._earliest[PROCESSING_TIME]
        if event is not None:
            watermark = self.watermark
            if watermark is not None and event <= watermark:
                return True
        return processing is not None and processing <= self._clock()

    def fire(self, on_timer: Callable[[Any, float, Any, Any], None], collector: Any, coordinator: Any,
             failed: Callable[[BaseException, Any, float], None], before_each: Callable[[], None] | None) -> int:
        """Fire every due timer (see the module docstring): the task's own through ``on_timer(key,
        timestamp, collector, coordinator)`` (the task's; an exception it raises goes to ``failed(exc,
        key, timestamp)``, which raises), a namespace's through its ``on_fire`` (an exception it
        raises is a TaskError naming the namespace); ``before_each()`` runs before each (a crash
        point; None: nothing). Returns how many fired."""
        if not self.due():
            return 0
        fired = self._fire_domain(EVENT_TIME, self.watermark, on_timer, (collector, coordinator), failed, before_each)
        return fired + self._fire_domain(PROCESSING_TIME, self._clock(), on_timer, (collector, coordinator), failed,
                                         before_each)

    def _fire_domain(self, domain: str, now: float | None, on_timer: Callable[..., None], args: tuple[Any, ...],
                     failed: Callable[[BaseException, Any, float], None],
                     before_each: Callable[[], None] | None) -> int:
        earliest = self._earliest[domain]
        if now is None or earliest is None or earliest > now:
            return 0
        firing = self._round = _Round(domain, now, self._partition)
        self._firing_domain = domain  # only the callbacks run in between: they see the domain
        try:
            fired = firing.fire(self._store, self._namespaces, on_timer, *args, failed, before_each)
        finally:
            self._round = None
            self._firing_domain = None
        self._earliest[domain] = self._first(domain)
        return fired
