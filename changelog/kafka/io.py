"""Kafka I/O shared by the Kafka changelog (:mod:`.partition`), the Kafka job streams (:mod:`.streams`)
and the PySpark Data Source (:mod:`.spark_source`): per-process client pools, end-offset probing
(which works around Tansu's ListOffsets answer, see :func:`end_offsets` and :func:`find_data_end`),
exact offset-range reads and an acknowledged topic writer. Everything here raises kafka-python errors
or the typed error its caller names; nothing knows about jobs."""

from __future__ import annotations

import atexit
import logging
import threading
import time
from collections import deque
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import NewTopic
from kafka.errors import TopicAlreadyExistsError

from localstate.errors import InputError, LocalStateError, OutputError

from .client import bootstrap_servers, kafka_error

__all__ = ["TopicWriter", "wait_acknowledged", "consumer_settings", "listed_ends", "start_offsets", "find_data_end", "topic_checked", "remember_topic", "end_offsets", "read_range", "read_records", "topic_partitions", "topic_id", "ensure_topic",
           "produce", "pooled_consumer", "release_consumer", "close_clients", "pooled_admin", "drop_admin", "TopicFollower", "WAIT_FETCH_MS", "BUSY_FETCH_MS"]

log = logging.getLogger(__name__)


# -- clients (one pool per worker process: Python workers are reused across batches) -------------

_LOCK = threading.Lock()
_FREE_CONSUMERS: dict[str, list[Any]] = {}
_PRODUCERS: dict[str, Any] = {}
_ADMINS: dict[str, Any] = {}
_ENSURED: set[tuple[str, str]] = set()


def _pool_key(settings: Mapping[str, Any], extra: Mapping[str, Any]) -> str:
    return repr(sorted({**settings, **extra}.items()))


def consumer_settings(settings: Mapping[str, Any], **tuning: Any) -> dict[str, Any]:
    """kafka-python consumer arguments of every localstate reader: no group, nothing committed to
    Kafka (positions live in checkpoints), plus ``tuning``."""
    # Out of range (records deleted by retention) must fail loudly, never silently jump.
    return {**settings, "group_id": None, "enable_auto_commit": False, "auto_offset_reset": "none", **tuning}


#: How old a pooled consumer's topic metadata may get (kafka-python's default is 5 minutes): a topic
#: deleted and created again shows its new id (:func:`topic_id`) to a long-running driver this soon.
METADATA_MAX_AGE_MS = 10_000


_MAX_POLL_RECORDS = 5000


def _consumer_config(settings: Mapping[str, Any]) -> dict[str, Any]:
    return consumer_settings(settings, allow_auto_create_topics=False, fetch_max_wait_ms=100,
                             max_poll_records=_MAX_POLL_RECORDS,
                             metadata_max_age_ms=METADATA_MAX_AGE_MS)


def pooled_consumer(settings: Mapping[str, Any]) -> Any:
    """A KafkaConsumer (no group, no auto-commit, nothing assigned) for ``settings``: from this
    process's pool, or new. Give it back with :func:`release_consumer`. Raises kafka-python errors."""
    key = _pool_key(settings, {})
    with _LOCK:
        free = _FREE_CONSUMERS.get(key)
        if free:
            return free.pop()
    return KafkaConsumer(**_consumer_config(settings))


def release_consumer(settings: Mapping[str, Any], consumer: Any, ok: bool = True) -> None:
    """Return ``consumer`` to the pool, or close it when it failed (``ok`` false)."""
    if not ok:
        consumer.close()
        return
    try:
        consumer.assign([])
    except Exception:  # noqa: BLE001 - a consumer that cannot even unassign is not worth keeping
        consumer.close()
        return
    with _LOCK:
        _FREE_CONSUMERS.setdefault(_pool_key(settings, {}), []).append(consumer)


def _producer(settings: Mapping[str, Any], tuning: Mapping[str, Any], topic: str) -> Any:
    """This process's pooled producer for ``topic`` with these settings. One per topic: a
    kafka-python 3.0 producer that first sends to a topic created after it last fetched metadata
    refreshes that topic's metadata alone, forgets the leaders of the topics it sent to before, and
    its sender thread then asks for metadata in a loop, a whole core for as long as the process
    lives. A producer that only ever sends to one topic never adds one."""
    key = _pool_key(settings, {**tuning, "topic": topic})
    with _LOCK:
        producer = _PRODUCERS.get(key)
    if producer is None:
        producer = KafkaProducer(**settings, **tuning)
        with _LOCK:
            producer = _PRODUCERS.setdefault(key, producer)
    return producer


def _drop_producer(producer: Any) -> None:
    """Forget and close a producer whose delivery failed: what it still buffers must not reach
    Kafka after a retried attempt re-sent it."""
    with _LOCK:
        for key, value in list(_PRODUCERS.items()):
            if value is producer:
                del _PRODUCERS[key]
    try:
        producer.close(timeout=0)
    except Exception:  # noqa: BLE001 - closing a broken producer may fail again; nothing to save
        log.debug("closing a failed producer raised", exc_info=True)


def pooled_admin(settings: Mapping[str, Any]) -> Any:
    """This process's pooled KafkaAdminClient for ``settings`` (drop it with :func:`drop_admin`
    after a failure). Raises kafka-python errors."""
    key = _pool_key(settings, {})
    with _LOCK:
        admin = _ADMINS.get(key)
    if admin is None:
        admin = KafkaAdminClient(**settings)
        with _LOCK:
            admin = _ADMINS.setdefault(key, admin)
    return admin


def drop_admin(admin: Any) -> None:
    """Forget and close a pooled admin client that failed."""
    with _LOCK:
        for key, value in list(_ADMINS.items()):
            if value is admin:
                del _ADMINS[key]
    try:
        admin.close()
    except Exception:  # noqa: BLE001 - a broken client may fail to close; nothing to save
        log.debug("closing an admin client raised", exc_info=True)


def close_clients() -> None:
    """Close every pooled consumer, producer and admin client of this process."""
    with _LOCK:
        consumers = [c for free in _FREE_CONSUMERS.values() for c in free]
        producers = list(_PRODUCERS.values())
        admins = list(_ADMINS.values())
        _FREE_CONSUMERS.clear()
        _PRODUCERS.clear()
        _ADMINS.clear()
        _ENSURED.clear()
    for client in consumers + producers + admins:
        try:
            client.close(timeout=1) if client in producers else client.close()
        except Exception:  # noqa: BLE001 - best effort at exit
            log.debug("closing a Kafka client raised", exc_info=True)


atexit.register(close_clients)


def topic_checked(servers: str, topic: str) -> bool:
    """Whether this process already found (or created) ``topic`` on ``servers``; forgotten by
    :func:`close_clients`. Lets an output check its topic once per worker, not once per batch."""
    return (servers, topic) in _ENSURED


def remember_topic(servers: str, topic: str) -> None:
    with _LOCK:
        _ENSURED.add((servers, topic))


# -- shared reading/writing functions (job streams and the Data Source) ---------------------------

def topic_partitions(consumer: Any, topic: str) -> int:
    """Number of partitions of ``topic``; 0 when it does not exist."""
    return len(consumer.partitions_for_topic(topic) or ())


_NO_TOPIC_ID = "00000000-0000-0000-0000-000000000000"


def topic_id(consumer: Any, topic: str) -> str | None:
    """``topic``'s id in the metadata ``consumer`` last fetched (Kafka 2.8+ and Tansu name one: a topic
    deleted and created again gets a new one); None when the broker gives none or the client does not
    keep it. kafka-python keeps it in its client's cluster metadata, which the consumer does not expose."""
    cluster = getattr(consumer, "_cluster", None) or getattr(getattr(consumer, "_client", None), "cluster", None)
    lookup = getattr(cluster, "topic_id", None)
    if lookup is None:
        return None
    found = lookup(topic)
    return None if found is None or str(found) == _NO_TOPIC_ID else str(found)


# -- end offsets: Tansu's ListOffsets quirk, handled here once ----------------------------------------
#
# A broker's ListOffsets(latest) is meant to be the high watermark, but Tansu answers the base offset
# of the last *batch* + 1 (after 1000 records produced in batches it said 886). So ListOffsets is only
# ever used as a FLOOR: the true end comes from the high watermark a fetch response carries, read from
# just below the floor. end_offsets() does it for stream positions (the high watermark), and
# find_data_end() for changelogs (one past the last *data* record: transaction markers excluded).

def listed_ends(consumer: Any, topic: str, partitions: Sequence[int], *,
                timeout_ms: int | None = None) -> dict[int, int]:
    """ListOffsets(latest) of each partition: a floor of its end, never above it (see above).
    Raises kafka-python errors."""
    tps = [TopicPartition(topic, p) for p in partitions]
    reported = consumer.end_offsets(tps) if timeout_ms is None else consumer.end_offsets(tps, timeout_ms=timeout_ms)
    return {tp.partition: int(reported.get(tp) or 0) for tp in tps}


def start_offsets(consumer: Any, topic: str, partitions: Sequence[int]) -> dict[int, int]:
    """ListOffsets(earliest) of each partition: its log start offset, below which records were
    deleted (retention, DeleteRecords). Raises kafka-python errors."""
    tps = [TopicPartition(topic, p) for p in partitions]
    reported = consumer.beginning_offsets(tps)
    return {tp.partition: int(reported.get(tp) or 0) for tp in tps}


def find_data_end(floor: int, read_from: Callable[[int], Iterable[list[Any]]]) -> int:
    """One past the last data record of a partition whose ListOffsets floor is ``floor``:
    ``read_from(start)`` yields lists of records from ``start`` up to the high watermark its fetches
    report. Reads from just below the floor, stepping back (x16) while the tail holds no data record
    (a transaction marker), down to 0 (an empty partition)."""
    step = 2
    while True:
        start = max(0, floor - step)
        last = None
        for batch in read_from(start):
            last = batch[-1].offset
        if last is not None:
            return last + 1
        if start == 0:
            return 0
        step *= 16


def end_offsets(consumer: Any, topic: str, partitions: Sequence[int], known: Mapping[int, int] | None = None,
                *, timeout: float = 2.0) -> dict[int, int]:
    """The end (high watermark) of each partition: the offset after its last record.

    ListOffsets is only a floor (see above). So each partition is fetched from one offset *below* the
    floor, where a record is known to exist (the floor is raised to the ``known`` ends, e.g. of a
    previous plan): the fetch is never empty, and its response carries the high watermark and any
    later records. A too-low answer can therefore only delay records to a later plan, and a run
    that plans until nothing is left drains everything. Partitions that return nothing within
    ``timeout`` (their last record compacted away or deleted) keep the floor. Uses ``consumer``
    exclusively.
    """
    known = known or {}
    tps = [TopicPartition(topic, p) for p in partitions]
    floors = listed_ends(consumer, topic, partitions)
    ends = {tp.partition: max(floors[tp.partition], int(known.get(tp.partition, 0))) for tp in tps}
    probe = {tp: ends[tp.partition] - 1 for tp in tps if ends[tp.partition] > 0}
    if not probe:
        return ends
    consumer.assign([])  # a fresh assignment forgets high watermarks seen before
    consumer.assign(list(probe))
    for tp, offset in probe.items():
        consumer.seek(tp, offset)
    pending = set(probe)
    deadline = time.monotonic() + timeout
    try:
        while pending and time.monotonic() < deadline:
            for tp, records in consumer.poll(timeout_ms=50).items():
                if records:
                    ends[tp.partition] = max(ends[tp.partition], records[-1].offset + 1)
            for tp in list(pending):
                highwater = consumer.highwater(tp)
                if highwater is not None:
                    ends[tp.partition] = max(ends[tp.partition], int(highwater))
                    pending.discard(tp)
    finally:
        consumer.assign([])
    if pending:
        log.debug("topic %s: no fetch answer for partitions %s within %.1fs; using ListOffsets", topic,
                  sorted(tp.partition for tp in pending), timeout)
    return ends


# -- following partitions: one consumer kept assigned, its fetches waiting at the broker --------------

WAIT_FETCH_MS = 500
"""How long a :class:`TopicFollower`'s fetch may wait at the broker for a record (``fetch_max_wait_ms``)
once its partitions have been quiet for :data:`BUSY_SECONDS`: bounds how often an idle follower asks."""

BUSY_FETCH_MS = 10
"""...while records keep arriving: a broker may answer a waiting fetch only at its wait's end (Tansu
does), so a short wait bounds how late a follower sees a record; a busy follower pays a fetch per
this at most, where end probes cost four requests each."""

BUSY_SECONDS = 1.0
"""Seconds after the last record fetched during which a follower's fetches wait :data:`BUSY_FETCH_MS`."""

BUFFER_RECORDS = 50_000
"""Records a follower keeps fetched ahead of its reader at most: past that it fetches only to read."""


class TopicFollower:
    """Follows partitions of a topic from the positions its caller gives, with one consumer of its own
    that stays assigned between calls (not pooled), so that one fetch both finds and brings the records
    that arrived: no end probe (ListOffsets, metadata) and no assign-and-seek per read. What it fetches
    is kept per partition until :meth:`records` hands it out, in offset order; a position other than
    where it follows from (a rollback, a reopen) makes it seek there and drop what it kept. Fetches
    wait at the broker (a long poll): :data:`BUSY_FETCH_MS` while records keep arriving,
    :data:`WAIT_FETCH_MS` once idle. Raises kafka-python errors (the consumer is then closed; the next
    call opens another). Not thread safe."""

    def __init__(self, settings: Mapping[str, Any], topic: str, *, max_wait_ms: int = WAIT_FETCH_MS,
                 busy_wait_ms: int = BUSY_FETCH_MS) -> None:
        self.settings = settings
        self.topic = topic
        self.max_wait_ms = max_wait_ms
        self.busy_wait_ms = busy_wait_ms
        self._consumer: Any = None
        self._kept: dict[int, deque[Any]] = {}  # partition -> records fetched, not handed out yet
        self._low: dict[int, int] = {}  # partition -> every record in [low, next) is in _kept
        self._next: dict[int, int] = {}  # partition -> where the consumer fetches next
        self._busy_until = 0.0

    def following(self, partition: int, position: int) -> bool:
        """Whether a read of ``partition`` from ``position`` can go through this follower (it follows
        the partition from there, or from below with the records in between kept)."""
        low = self._low.get(partition)
        return self._consumer is not None and low is not None and low <= position <= self._next[partition]

    def end(self, partitions: Mapping[int, int]) -> dict[int, int]:
        """Follow ``partitions`` (partition -> position) and collect what arrived, without waiting:
        each partition's end as last seen (the high watermark of the latest fetch response, or past
        the last record kept), at least its position. Before the first fetch response of a partition,
        one fetch is waited for (up to ``request_timeout``), so an end is never made up."""
        try:
            self._follow(partitions)
            if self._room():
                self._poll(0)
            deadline = time.monotonic() + self.settings.get("request_timeout_ms", 30000) / 1000
            while any(self._highwater(p) is None for p in partitions) and time.monotonic() < deadline:
                self._poll(50)
            return {p: max(position, self._next[p], self._highwater(p) or 0) for p, position in partitions.items()}
        except BaseException:
            self.close()
            raise

    def wait(self, positions: Mapping[int, int], timeout: float) -> bool:
        """True as soon as any partition of ``positions`` has a record at or past its position; False
        after ``timeout`` seconds without one."""
        try:
            self._follow(positions)
            deadline = time.monotonic() + timeout
            while True:
                if any(self._kept[p] or (self._highwater(p) or 0) > self._next[p] for p in positions):
                    return True
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._poll(max(1, int(remaining * 1000)))
        except BaseException:
            self.close()
            raise

    def records(self, partition: int, start: int, end: int, *, timeout: float,
                on_stall: Callable[[int], LocalStateError]) -> Iterator[Any]:
        """The kafka-python records of ``partition`` with ``start <= offset < end``, in order, from what
        was kept, then fetched (gaps skipped). Call only when :meth:`following` says so. When no
        progress is made for ``timeout`` seconds, raises ``on_stall(position)``."""
        self._follow({partition: start})
        kept = self._kept[partition]
        position = start
        idle_since = time.monotonic()
        try:
            while position < end:
                while kept and kept[0].offset < end:
                    record = kept.popleft()
                    position = self._low[partition] = record.offset + 1
                    yield record
                if kept or self._next[partition] >= end:  # the rest of the range holds no record
                    position = self._low[partition] = end
                    break
                position = self._low[partition] = self._next[partition]  # past a gap (markers)
                self._poll(200)
                if kept or self._next[partition] > position:
                    idle_since = time.monotonic()
                elif time.monotonic() - idle_since > timeout:
                    raise on_stall(position)
        except (GeneratorExit, LocalStateError):
            raise
        except BaseException:
            self.close()
            raise

    def _room(self) -> bool:
        return sum(len(kept) for kept in self._kept.values()) < BUFFER_RECORDS

    def _highwater(self, partition: int) -> int | None:
        highwater = self._consumer.highwater(TopicPartition(self.topic, partition))
        return None if highwater is None else int(highwater)

    def _follow(self, positions: Mapping[int, int]) -> None:
        """The consumer, assigned to (at least) the partitions of ``positions`` and following each from
        its position: a partition whose position lies outside what is kept is sought there (a seek
        drops the fetch waiting at the broker, so only those that moved are)."""
        if self._consumer is None:
            self._consumer = KafkaConsumer(**{**_consumer_config(self.settings), "fetch_max_wait_ms": self.max_wait_ms})
            self._kept, self._low, self._next = {}, {}, {}
        consumer = self._consumer
        if not set(positions) <= set(self._kept):
            assigned = sorted(set(self._kept) | set(positions))
            consumer.assign([TopicPartition(self.topic, p) for p in assigned])
            for p in assigned:  # a new assignment starts every partition over
                self._seek(p, positions.get(p, self._low.get(p, 0)))
        for p, position in positions.items():
            kept = self._kept[p]
            if not self._low[p] <= position <= self._next[p]:
                self._seek(p, position)
                continue
            while kept and kept[0].offset < position:
                kept.popleft()
            self._low[p] = position

    def _seek(self, partition: int, position: int) -> None:
        self._consumer.seek(TopicPartition(self.topic, partition), position)
        self._kept[partition] = deque()
        self._low[partition] = self._next[partition] = position

    def _poll(self, timeout_ms: int) -> bool:
        """One poll of the consumer; keeps what it returns. True if it returned a record."""
        consumer = self._consumer
        now = time.monotonic()
        # The wait at the broker: short while records keep arriving (kafka-python reads it per fetch).
        consumer._fetcher.config["fetch_max_wait_ms"] = self.busy_wait_ms if now < self._busy_until \
            else self.max_wait_ms
        fetched = consumer.poll(timeout_ms=timeout_ms, max_records=_MAX_POLL_RECORDS)
        for tp, records in fetched.items():
            if records and tp.partition in self._kept:
                self._kept[tp.partition].extend(records)
                self._next[tp.partition] = max(self._next[tp.partition], records[-1].offset + 1)
        for p in self._kept:  # past what the fetches skipped (transaction markers, compacted records)
            self._next[p] = max(self._next[p], int(consumer.position(TopicPartition(self.topic, p))))
        if fetched:
            self._busy_until = time.monotonic() + BUSY_SECONDS
        return bool(fetched)

    def close(self) -> None:
        """Close the consumer and drop what it kept (a later call opens another)."""
        consumer, self._consumer = self._consumer, None
        self._kept, self._low, self._next = {}, {}, {}
        if consumer is not None:
            try:
                consumer.close()
            except Exception:  # noqa: BLE001 - closing is best effort: the consumer is dropped either way
                log.debug("closing a following Kafka consumer raised", exc_info=True)


def read_range(consumer: Any, topic: str, partition: int, start: int, end: int, *, timeout: float,
               on_stall: Callable[[int], LocalStateError]) -> Iterator[Any]:
    """Yield the kafka-python records of ``topic[partition]`` with ``start <= offset < end``, in
    order, using ``consumer`` exclusively. Gaps (compaction, transaction markers) are skipped.
    When no progress is made for ``timeout`` seconds, raises ``on_stall(position)``."""
    if start >= end:
        return
    tp = TopicPartition(topic, partition)
    consumer.assign([tp])
    consumer.seek(tp, start)
    position = start
    idle_since = time.monotonic()
    while position < end:
        records = consumer.poll(timeout_ms=200).get(tp)
        if not records:
            position = max(position, consumer.position(tp))
            if position < end and time.monotonic() - idle_since > timeout:
                raise on_stall(position)
            continue
        idle_since = time.monotonic()
        for record in records:
            if record.offset >= end:
                return
            if record.offset >= start:
                yield record
        position = records[-1].offset + 1


def read_records(settings: Mapping[str, Any], topic: str, partition: int, start: int, end: int, *,
                 error: type[LocalStateError] = InputError, **context: Any) -> Iterator[Any]:
    """:func:`read_range` with a pooled consumer: the kafka-python records of ``topic[partition]``
    with ``start <= offset < end``. Every failure (unreachable broker, no progress for
    ``request_timeout``, records deleted by retention) is raised as ``error``, naming the servers,
    topic, partition and offset, plus ``context``."""
    if start >= end:
        return
    servers = bootstrap_servers(settings)
    timeout = settings["request_timeout_ms"] / 1000
    where = {"topic": topic, "partition": partition, **context}

    def stalled(position: int) -> LocalStateError:
        return error(f"Kafka topic {topic!r} partition {partition} returned nothing at offset {position} for "
                     f"{timeout:.0f}s although records up to offset {end} were planned", offset=position,
                     bootstrap_servers=servers, **where,
                     hint="check the broker's health; if the records were deleted (retention, topic re-created), "
                          "the positions that point at them cannot be read any more")

    try:
        consumer = pooled_consumer(settings)
    except Exception as exc:  # noqa: BLE001 - kafka-python raises many kinds; all become typed
        raise kafka_error(exc, f"connect to read Kafka topic {topic!r}", servers, error=error, **where) from exc
    ok = False
    try:
        yield from read_range(consumer, topic, partition, start, end, timeout=timeout, on_stall=stalled)
        ok = True
    except GeneratorExit:
        ok = True  # the caller stopped early (e.g. a batch limit): the consumer is fine
        raise
    except LocalStateError:
        raise
    except Exception as exc:  # noqa: BLE001
        raise kafka_error(exc, f"read Kafka topic {topic!r}", servers, error=error, offset=start, **where) from exc
    finally:
        release_consumer(settings, consumer, ok)


def ensure_topic(settings: Mapping[str, Any], topic: str, partitions: int, replication_factor: int,
                 create: bool, configs: Mapping[str, str] | None = None) -> int:
    """The partition count of ``topic``, creating it with ``partitions`` partitions (and the topic
    ``configs``) when missing and ``create`` is true. Returns 0 when it is missing and may not be
    created. Raises kafka-python errors."""
    consumer = pooled_consumer(settings)
    ok = False
    try:
        count = topic_partitions(consumer, topic)
        if count == 0 and create:
            admin = KafkaAdminClient(**settings)
            try:
                admin.create_topics([NewTopic(topic, partitions, replication_factor, topic_configs=dict(configs or {}))])
                log.info("created Kafka topic %s with %d partitions", topic, partitions)
            except TopicAlreadyExistsError:
                pass  # another task created it a moment ago
            finally:
                admin.close()
            deadline = time.monotonic() + 10
            while count == 0 and time.monotonic() < deadline:
                count = topic_partitions(consumer, topic)  # an unknown topic makes it fetch fresh metadata
                if count == 0:
                    time.sleep(0.05)
        ok = True
        return count
    finally:
        release_consumer(settings, consumer, ok)


class TopicWriter:
    """Sends records to one topic with ``acks=all`` and waits, in :meth:`flush`, until every one
    is acknowledged. Partitions are chosen by the caller (:func:`partition_for` of the key).
    Errors are raised as ``error`` (a LocalStateError class) with ``context``."""

    def __init__(self, settings: Mapping[str, Any], topic: str, *, linger: float = 0.005,
                 compression: str | None = None, delivery_timeout: float = 30.0,
                 error: type[LocalStateError] = OutputError, **context: Any) -> None:
        self.settings = settings
        self.topic = topic
        self.servers = bootstrap_servers(settings)
        self.delivery_timeout = delivery_timeout
        self.error = error
        self.context = {"topic": topic, **context}
        request_ms = int(settings.get("request_timeout_ms", 30000))
        self._tuning = {
            "acks": "all", "linger_ms": int(linger * 1000), "compression_type": compression,
            "batch_size": 256 * 1024, "max_block_ms": int(delivery_timeout * 1000),
            "delivery_timeout_ms": max(int(delivery_timeout * 1000), request_ms + int(linger * 1000)),
            "allow_auto_create_topics": False,
        }
        self._futures: list[Any] = []
        self._producer: Any = None
        self.producer  # connect now: an unreachable cluster fails here, naming it

    @property
    def producer(self) -> Any:
        """This process's pooled producer for these settings and this topic (a new one after a failure)."""
        if self._producer is None:
            try:
                self._producer = _producer(self.settings, self._tuning, self.topic)
            except Exception as exc:  # noqa: BLE001 - kafka-python raises many kinds; all become typed
                raise self._error(exc, "connect to") from exc
        return self._producer

    def _error(self, exc: BaseException, action: str) -> LocalStateError:
        return kafka_error(exc, f"{action} Kafka topic {self.topic}", self.servers, error=self.error,
                           **self.context)

    def _fail(self, exc: BaseException, action: str) -> LocalStateError:
        """Discard the producer (nothing it still buffers may reach Kafka after a retry re-sent it)
        and the pending records; return the typed error."""
        if self._producer is not None:
            _drop_producer(self._producer)
            self._producer = None
        self._futures = []
        return self._error(exc, action)

    def partitions(self) -> int:
        try:
            return len(self.producer.partitions_for(self.topic) or ())
        except LocalStateError:
            raise
        except Exception as exc:  # noqa: BLE001
            raise self._error(exc, "get the partitions of") from exc

    def send(self, key: bytes | None, value: bytes | None, partition: int,
             headers: list[tuple[str, bytes]] | None = None) -> None:
        producer = self.producer
        try:
            self._futures.append(producer.send(self.topic, key=key, value=value, partition=partition,
                                               headers=headers))
        except Exception as exc:  # noqa: BLE001
            raise self._fail(exc, "send to") from exc

    def flush(self) -> int:
        """Wait until every record sent so far is acknowledged by all in-sync replicas; return
        how many were. On failure (``delivery_timeout``) raises, having discarded the producer."""
        futures, self._futures = self._futures, []
        if not futures:
            return 0
        try:
            wait_acknowledged(self.producer, futures, self.delivery_timeout)
        except LocalStateError:
            raise
        except Exception as exc:  # noqa: BLE001
            raise self._fail(exc, "deliver records to") from exc
        return len(futures)


def wait_acknowledged(producer: Any, futures: list[Any], timeout: float) -> None:
    """Flush ``producer`` and raise unless every one of ``futures`` (its sends) was acknowledged
    within ``timeout`` seconds (TimeoutError, or the send's own error)."""
    producer.flush(timeout=timeout)
    for future in futures:
        if not future.is_done:
            raise TimeoutError(f"{sum(not f.is_done for f in futures)} record(s) not acknowledged within {timeout:g}s")
        if future.failed():
            raise future.exception


def produce(settings: Mapping[str, Any], topic: str, records: Iterable[tuple[bytes | None, bytes | None, int]],
            **writer_options: Any) -> int:
    """Send ``(key, value, partition)`` records to ``topic`` and wait for all acknowledgements
    (test/demo helper for filling input topics). Returns the number sent."""
    writer = TopicWriter(settings, topic, **writer_options)
    sent = 0
    for key, value, partition in records:
        writer.send(key, value, partition)
        sent += 1
        if sent % 50_000 == 0:
            writer.flush()  # bound the producer's buffer
    writer.flush()
    return sent
