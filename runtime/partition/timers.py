"""The time of one task partition: its watermark, its processing clock, and its timers.

:class:`PartitionTime` is the partition's :class:`~localstate.core.time.Timers` (``context.timers``)
and the :class:`~localstate.core.time.TimeSource` of its stores (``StoreContext.time``).

*Watermark*: the largest event timestamp the partition has seen minus ``[time] allowed_lateness``,
never below the watermark of the checkpoint it was opened from (so it never goes back across
restarts either). The feed loop raises :attr:`PartitionTime.high` after each record (a batch task:
after each batch), so the task sees the watermark from before the record (or batch) it processes.

*Timers* are state: each is an entry of the logged kv store :data:`~localstate.core.time.TIMER_STORE`
(raw bytes, recovered, flushed and checkpointed with the other stores), keyed

    domain (1 byte) | timestamp (8 bytes, order-preserving) | key (the timer key serde's bytes)

so a range scan of a domain returns its timers in timestamp order, and registering the same
(domain, key, timestamp) twice writes the same entry (deduplicated, as Flink). The earliest
timestamp of each domain is cached, so a batch boundary with nothing due costs two comparisons.

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
import json
import json.encoder
import json.scanner
import math
import struct
from itertools import repeat
from operator import itemgetter
from typing import Any, Callable

from localstate.core.codecs import FAST_ERRORS, fast_codec
from localstate.core.config import JobConfig
from localstate.core.serdes import JsonSerde, Serde
from localstate.core.time import EVENT_TIME, PROCESSING_TIME, TIMER_STORE
from localstate.errors import ConfigError, InvalidValueError

__all__ = ["PartitionTime", "encode_timestamp", "decode_timestamp", "SCAN_CHUNK", "split_timer_entry"]

SCAN_CHUNK = 16384
"""Due timers read from the store per scan while firing (bounded memory for a million due timers)."""

_PREFIX = {EVENT_TIME: b"e", PROCESSING_TIME: b"p"}
_SIGN = 1 << 63
_ALL = (1 << 64) - 1
_u64 = struct.Struct(">Q")
_f64 = struct.Struct(">d")
_pack_u64, _unpack_u64, _pack_f64, _unpack_f64 = _u64.pack, _u64.unpack, _f64.pack, _f64.unpack


_json_text = json.JSONDecoder().decode
_json_scan = json.scanner.make_scanner(json.JSONDecoder())
"""``(value, end)`` of the JSON text at an index of a string: the C scanner, with no Python frame"""
_json_str = json.encoder.encode_basestring
"""JsonSerde's text of an exact ``str`` (compact, ``ensure_ascii=False``): the C function its encoder calls"""
_UNDECODED = object()
"""a fired key the chunk's decoding left to the per-timer path"""
_first_item, _second_item = itemgetter(0), itemgetter(1)


def _json_decode(data: bytes) -> Any:
    return _json_text(data.decode("utf-8"))


def _decode_timestamps(entries: list[bytes]) -> tuple[float, ...]:
    """:func:`decode_timestamp` of each store key's timestamp, in three C calls and one comprehension."""
    count = len(entries)
    bits = struct.unpack(f">{count}Q", b"".join([entry[1:9] for entry in entries]))
    flipped = [b & ~_SIGN if b & _SIGN else b ^ _ALL for b in bits]
    return struct.unpack(f">{count}d", struct.pack(f">{count}Q", *flipped))


def _json_decode_many(texts: list[bytes]) -> list[Any]:
    """The json keys of a chunk, decoded by C-level maps (no frame per key); raises (ValueError,
    StopIteration) unless each text is exactly one JSON value."""
    strings = list(map(bytes.decode, texts))
    scanned = list(map(_json_scan, strings, repeat(0)))
    # a StopIteration inside map() ends it early: a short list is a text that is no JSON value
    if len(scanned) != len(strings) or list(map(_second_item, scanned)) != list(map(len, strings)):
        raise ValueError("not one JSON value per key")
    return list(map(_first_item, scanned))


def encode_timestamp(ts: float) -> bytes:
    """8 bytes whose byte order is the numeric order of ``ts`` (IEEE 754 with the sign bit flipped
    for positives and every bit flipped for negatives)."""
    (bits,) = _u64.unpack(_f64.pack(ts + 0.0))  # + 0.0: -0.0 and 0.0 are one time
    return _u64.pack(bits ^ _ALL if bits & _SIGN else bits | _SIGN)


def decode_timestamp(data: bytes) -> float:
    """The inverse of :func:`encode_timestamp`."""
    (bits,) = _u64.unpack(data)
    return _f64.unpack(_u64.pack(bits & ~_SIGN if bits & _SIGN else bits ^ _ALL))[0]


def split_timer_entry(entry: bytes) -> tuple[str, float, bytes]:
    """``(domain, timestamp, key bytes)`` of a timer store entry (what a rescale routes a timer by)."""
    domain = EVENT_TIME if entry[:1] == _PREFIX[EVENT_TIME] else PROCESSING_TIME
    return domain, decode_timestamp(entry[1:9]), entry[9:]


def _after(encoded: bytes) -> bytes:
    """The smallest 8-byte string greater than ``encoded``: the exclusive end of a scan up to it."""
    return _u64.pack(min(_u64.unpack(encoded)[0] + 1, _ALL))


class _Round:
    """A firing in progress in one domain: the due timers of the current scan (in key order), and a
    heap of the due timers registered while firing below the scan's end."""

    __slots__ = ("domain", "now", "last", "heap", "pending", "deleted", "ahead")

    def __init__(self, domain: str, now: float) -> None:
        self.domain = domain
        self.now = now
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
        self._key_serde: Serde | None = None
        self._encode_key: Callable[[Any], bytes] | None = None
        self._decode_key: Callable[[bytes], Any] | None = None
        self._decode_many: Callable[[list[bytes]], list[Any]] | None = None
        self._json_keys = False
        self._earliest: dict[str, float | None] = {EVENT_TIME: None, PROCESSING_TIME: None}
        self._round: _Round | None = None
        self._firing_domain: str | None = None
        self._task_fires = True
        self._usable = False
        """timers kept and ``on_timer`` defined: registering may go ahead"""

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
        """Keep timers in ``store`` (the recovered timer store), keys encoded by ``key_serde``;
        ``task_fires``: the task overrides ``on_timer`` (registering is refused otherwise)."""
        self._store = store
        self._key_serde = key_serde
        self._encode_key, self._decode_key = fast_codec(key_serde)
        if type(key_serde) is JsonSerde:
            # The store holds only keys this service encoded: the serde's checks of foreign data
            # (what its serialize would refuse) cannot fail, and cost as much as the decoding.
            self._decode_key = _json_decode
        self._json_keys = type(key_serde) is JsonSerde
        decode = self._decode_key
        self._decode_many = _json_decode_many if self._json_keys else lambda texts: list(map(decode, texts))
        self._task_fires = task_fires
        self._usable = task_fires
        for domain in _PREFIX:
            self._earliest[domain] = self._first(domain)

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
        self._register(EVENT_TIME, key, timestamp)

    def register_processing_time(self, key: Any, timestamp: float) -> None:
        self._register(PROCESSING_TIME, key, timestamp)

    def delete_event_time(self, key: Any, timestamp: float) -> None:
        self._delete(EVENT_TIME, key, timestamp)

    def delete_processing_time(self, key: Any, timestamp: float) -> None:
        self._delete(PROCESSING_TIME, key, timestamp)

    def _check_usable(self, domain: str) -> None:
        """Raise why this partition cannot take timers (none kept, or no ``on_timer``), if so."""
        if self._store is None:
            raise ConfigError.at("time.timers", f"the task of partition {self._partition} registered a {domain}-time "
                                 f"timer, but job {self._job.name!r} keeps no timers",
                                 hint="add a [time] table with timers = true to the job config")
        if not self._task_fires:
            raise ConfigError.at("job.task", "the task registers timers but does not define on_timer(); a timer "
                                 "that fires would have nowhere to go",
                                 hint="override on_timer(self, key, timestamp, collector, coordinator) in the task")

    def _entry(self, domain: str, key: Any, timestamp: Any) -> tuple[float, bytes]:
        """``(timestamp as float, store key)`` of a timer; typed errors for what cannot be one."""
        if not self._usable:
            self._check_usable(domain)
        if timestamp.__class__ is not float or timestamp - timestamp != 0.0:  # not a finite float: look closer
            if isinstance(timestamp, bool) or not isinstance(timestamp, (int, float)) or not math.isfinite(timestamp):
                raise InvalidValueError(f"a {domain}-time timer needs a finite timestamp (seconds since the epoch), "
                                        f"got {timestamp!r} for key {key!r}", store=TIMER_STORE,
                                        partition=self._partition,
                                        hint="pass a number such as envelope.timestamp + 60")
            timestamp = float(timestamp)
        try:
            if key.__class__ is str and self._json_keys:  # the common key, without the encoder's frames
                kb = _json_str(key).encode()
            else:
                kb = self._encode_key(key)  # type: ignore[misc]
        except FAST_ERRORS:
            kb = self._slow_key(key)
        (bits,) = _unpack_u64(_pack_f64(timestamp + 0.0))  # encode_timestamp, inline: the per-timer path
        return timestamp, _PREFIX[domain] + _pack_u64(bits ^ _ALL if bits & _SIGN else bits | _SIGN) + kb

    def _slow_key(self, key: Any) -> bytes:
        """``key`` encoded by the serde itself after the fast path refused it (a typed error if it cannot)."""
        try:
            return self._key_serde.serialize(key)  # type: ignore[union-attr]
        except Exception as exc:  # noqa: BLE001 - every serde failure is reported the same way
            raise InvalidValueError(f"cannot encode the timer key {key!r} with serde "
                                    f"{self._job.time.timer_key_serde!r}: {exc}", store=TIMER_STORE,
                                    partition=self._partition,
                                    hint="set [time] timer_key_serde to a serde that encodes the task's keys") \
                from exc

    def _register(self, domain: str, key: Any, timestamp: Any) -> None:  # noqa: C901
        timestamp, entry = self._entry(domain, key, timestamp)
        if self._forbid_past:
            now = self._clock() if domain == PROCESSING_TIME else self.watermark
            if now is not None and timestamp < now:
                raise ConfigError.at("time.past_timers", f"partition {self._partition}: a {domain}-time timer for "
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

    def _delete(self, domain: str, key: Any, timestamp: Any) -> None:
        _timestamp, entry = self._entry(domain, key, timestamp)
        self._store.delete(entry)
        firing = self._round
        if firing is not None and entry > firing.last:
            firing.ahead = True
        elif firing is not None and firing.domain == domain:
            firing.pending.discard(entry)
            firing.deleted.add(entry)

    def _first(self, domain: str) -> float | None:
        """The earliest timer of ``domain`` in the store, or None."""
        prefix = _PREFIX[domain]
        for entry, _ in self._store.range(prefix, bytes([prefix[0] + 1])):
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
        """Fire every due timer (see the module docstring): ``on_timer(key, timestamp, collector,
        coordinator)`` (the task's); an exception it raises goes to ``failed(exc, key, timestamp)``,
        which raises; ``before_each()`` runs before each (a crash point; None: nothing). Returns how
        many fired."""
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
        store, prefix = self._store, _PREFIX[domain]
        end = prefix + _after(encode_timestamp(now))
        decode_key, slow_decode = self._decode_key, self._key_serde.deserialize  # type: ignore[union-attr]
        decode_many = self._decode_many
        firing = self._round = _Round(domain, now)
        heap, pending, deleted = firing.heap, firing.pending, firing.deleted
        pop, delete, delete_all = heapq.heappop, store.delete, store.delete_all
        unpack_u64, pack_u64, unpack_f64 = _unpack_u64, _pack_u64, _unpack_f64
        collector, coordinator = args
        start = prefix
        fired = 0
        # Scans read the backend directly (the cheapest way through a million timers): the store is
        # flushed first, so the backend holds every timer registered so far. Flushing before the
        # commit is as safe as any spill: a crash before the checkpoint rolls the store back.
        store.flush()
        backend = store.backend
        self._firing_domain = domain  # only the task's on_timer runs in between: it sees the domain
        try:
            while True:
                scanned = list(map(_first_item, backend.scan(start, end, SCAN_CHUNK)))
                exhausted = len(scanned) < SCAN_CHUNK
                firing.last = end if exhausted else scanned[-1]
                try:
                    keys = decode_many([entry[9:] for entry in scanned])  # type: ignore[misc]
                except (*FAST_ERRORS, StopIteration):
                    keys = [_UNDECODED] * len(scanned)  # one refused: each decoded as it fires
                stamps = _decode_timestamps(scanned)
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
                            key = _UNDECODED
                            (bits,) = unpack_u64(entry[1:9])  # decode_timestamp, inline
                            timestamp = unpack_f64(pack_u64(bits & ~_SIGN if bits & _SIGN else bits ^ _ALL))[0]
                        elif index < count:
                            entry = scanned[index]
                            key = keys[index]
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
                        if key is _UNDECODED:
                            try:
                                key = decode_key(entry[9:])  # type: ignore[misc]
                            except FAST_ERRORS:
                                key = slow_decode(entry[9:])
                        try:
                            on_timer(key, timestamp, collector, coordinator)
                        except (Exception, SystemExit) as exc:
                            failed(exc, key, timestamp)
                            raise
                        fired += 1
                except BaseException:
                    unfired = [entry for entry in scanned[index:] if entry not in deleted]
                    if unfired:
                        store.put_many(unfired, [b""] * len(unfired))
                    raise
                if exhausted:
                    break
                start = firing.last + b"\x00"
                if firing.ahead:
                    store.flush()
                    firing.ahead = False
                deleted.clear()  # below the next scan's start
        finally:
            self._round = None
            self._firing_domain = None
        self._earliest[domain] = self._first(domain)
        return fired
