"""One partition of a Kafka changelog topic: buffered appends, a transactional flush, exact reads.

Offsets. Kafka assigns offsets at the broker, and transaction commit markers take offsets of
their own, so offsets have gaps. This partition's *end offset* is therefore defined on data
records: one past the offset of the last data record (0 when there is none). ``flush()`` returns
it from the offsets the broker acknowledged for the records sent (last offset + 1), and
``read(start, end)`` yields exactly the data records with ``start <= offset < end``.

Why not ListOffsets. Tansu's ListOffsets(latest) is only a floor of the end (see
:mod:`localstate.changelog.kafka.io`, which handles that quirk for every Kafka reader). A partition
opened without having written finds its end with ``io.find_data_end``: from just below that floor it
reads forward until a fetch reaches the high watermark the fetch responses carry, and takes the last
data record seen; if the tail is a transaction marker it first steps back a little. Every read uses a consumer of its own: a reused consumer can
receive the answer to a fetch it sent before the latest flush, whose stale high watermark would end
the read early. See docs/kafka.md.

Fencing. With ``transactions = true`` (the default) the writer is a transactional producer whose
``transactional.id`` is derived from topic and partition; opening the partition for writing
(``init_transactions``) makes the broker refuse every later write of any older writer of the same
partition (ProducerFenced). The older writer's flush then raises ChangelogFencedError. Records
that an older writer got in *before* the new writer opened lie below the end offset the new one
reads at recovery, so the commit protocol's trim neutralises them like any uncommitted record.
Reads use ``read_uncommitted`` on purpose: Tansu does not hide aborted transactions from
``read_committed`` consumers, and the trim makes the distinction unnecessary.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any, Iterable, Iterator

from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.errors import KafkaError

from localstate.core.changelog import ChangelogPartition, ChangelogRecord
from localstate.errors import ChangelogError, ChangelogFencedError

from .client import kafka_error
from .io import consumer_settings, find_data_end, listed_ends

if TYPE_CHECKING:  # pragma: no cover
    from .system import KafkaChangelogSystem

__all__ = ["KafkaChangelogPartition"]

log = logging.getLogger(__name__)

_FENCED = ("ProducerFencedError", "InvalidProducerEpochError", "TransactionalIdNotFoundError")
_POLL_MS = 50


class KafkaChangelogPartition(ChangelogPartition):
    """A Kafka topic partition used as a changelog. ``writable=False`` opens a reader (no producer,
    no fencing). Not thread safe: one caller drives it, like the task partition that owns it.

    Guarantees:
    - ``flush()`` returns only when every appended record is acknowledged by all in-sync replicas
      (``acks=all``) and, with transactions, the transaction is committed; it returns the end offset.
      It either succeeds within ``commit_timeout`` or raises ChangelogError naming topic, partition
      and bootstrap servers. After a failed flush the partition refuses further use: the task must
      be restarted, and recovery brings it back to the last checkpoint.
    - ``read(start, end)`` yields exactly the data records in ``[start, min(end, log end))``, in
      offset order; tombstones have ``value None``. A read that makes no progress for
      ``request_timeout`` raises ChangelogError instead of hanging.
    """

    def __init__(self, system: "KafkaChangelogSystem", stream: str, partition: int, *, writable: bool = True) -> None:
        self.system = system
        self.stream = stream
        self.partition = partition
        self.topic = system.topic(stream)
        self.writable = writable
        self._tp = TopicPartition(self.topic, partition)
        self._pending: list[tuple[bytes, bytes | None]] = []
        self._end: int | None = None            # data end offset, once known
        self._failure: str | None = None
        self._closed = False
        self._producer: KafkaProducer | None = None
        self.transactional_id: str | None = None
        if writable:
            self._producer = self._open_producer()

    # ------------------------------------------------------------------ context for errors

    def _where(self) -> dict[str, Any]:
        return {"stream": self.stream, "topic": self.topic, "partition": self.partition}

    def _error(self, exc: BaseException, action: str, **context: Any) -> ChangelogError:
        if type(exc).__name__ in _FENCED:
            return ChangelogFencedError(
                f"cannot {action}: a newer writer of this changelog partition took over "
                f"(transactional.id {self.transactional_id!r} was initialised again; {type(exc).__name__})",
                hint="another instance of this task partition is running; stop this one (its uncommitted "
                     "work is discarded) and let the newer instance continue",
                bootstrap_servers=self.system.servers, **self._where(), **context)
        return kafka_error(exc, action, self.system.servers, **self._where(), **context)  # type: ignore[return-value]

    # ------------------------------------------------------------------ writer

    def _open_producer(self) -> KafkaProducer:
        system = self.system
        settings: dict[str, Any] = {
            **system.client,
            "acks": "all",
            "enable_idempotence": True,
            "linger_ms": int(system.config["linger"] * 1000),
            "batch_size": system.config["batch_size"],
            "max_request_size": system.config["max_request_size"],
            "compression_type": None if system.config["compression"] == "none" else system.config["compression"],
            # Bounds send() when metadata is missing and init_transactions(); flush has its own deadline.
            "max_block_ms": int(system.config["commit_timeout"] * 1000),
            "delivery_timeout_ms": int((system.config["commit_timeout"] + system.config["request_timeout"]
                                        + system.config["linger"]) * 1000),
        }
        if system.config["transactions"]:
            self.transactional_id = f"{system.config['transactional_id_prefix']}{self.topic}.{self.partition}"
            settings["transactional_id"] = self.transactional_id
            settings["transaction_timeout_ms"] = max(60_000, int(2 * system.config["commit_timeout"] * 1000))
        producer = None
        try:
            producer = KafkaProducer(**settings)
            if self.transactional_id is not None:
                # Fences every older producer with this transactional.id before we read the end offset.
                producer.init_transactions()
        except KafkaError as exc:
            if producer is not None:
                _close_producer(producer)
            raise self._error(exc, "open the changelog partition for writing") from exc
        return producer

    def _check_writable(self) -> None:
        if self._closed:
            raise ChangelogError("changelog partition is closed", **self._where(), hint="open the partition again")
        if not self.writable:
            raise ChangelogError("changelog partition was opened read-only", **self._where(),
                                 hint="use KafkaChangelogSystem.partition() to write")
        if self._failure is not None:
            raise ChangelogError(f"changelog partition is unusable after a failed flush: {self._failure}",
                                 **self._where(), bootstrap_servers=self.system.servers,
                                 hint="restart the task: recovery restores the stores to the last checkpoint")

    def append(self, key: bytes, value: bytes | None) -> None:
        self._check_writable()
        self._pending.append(_record(key, value, self))

    def append_many(self, records: Iterable[tuple[bytes, bytes | None]]) -> None:
        self._check_writable()
        pending = self._pending
        for key, value in records:
            pending.append(_record(key, value, self))

    def flush(self) -> int:
        """Send every appended record in one transaction, wait for ``acks=all`` and the commit;
        return the end offset (last acknowledged offset + 1)."""
        self._check_writable()
        if not self._pending:
            return self.end_offset()
        records = self._pending
        timeout = self.system.config["commit_timeout"]
        deadline = time.monotonic() + timeout
        producer = self._producer
        assert producer is not None
        phase = "send"
        try:
            if self.transactional_id is not None:
                producer.begin_transaction()
            send, topic, partition = producer.send, self.topic, self.partition
            futures = [send(topic, key=key, value=value, partition=partition) for key, value in records]
            phase = "wait for acknowledgements"
            producer.flush(timeout=max(0.0, deadline - time.monotonic()))
            for future in futures:
                if future.failed():
                    raise future.exception
            first, last = futures[0].value.offset, futures[-1].value.offset
            if self.transactional_id is not None:
                phase = "commit the transaction"
                self._commit_transaction(max(0.0, deadline - time.monotonic()))
            if time.monotonic() > deadline:
                raise _Timeout()
        except (KafkaError, _Timeout) as exc:
            self._fail(f"{phase} failed: {type(exc).__name__}")
            if isinstance(exc, _Timeout) or type(exc).__name__ == "KafkaTimeoutError":
                raise ChangelogError(
                    f"changelog flush of {len(records)} record(s) did not complete within commit_timeout "
                    f"({timeout:g} s) while trying to {phase}; no end offset is reported, so the commit does not happen",
                    hint="check the Kafka brokers' health and the network; raise commit_timeout if the cluster "
                         "is just slow; restarting the task recovers from the last checkpoint",
                    bootstrap_servers=self.system.servers, **self._where()) from exc
            raise self._error(exc, f"flush the changelog ({phase})") from exc
        except BaseException:
            self._fail("interrupted")
            raise
        if self._end is not None and first < self._end:
            # Only possible if something else writes to this partition.
            log.warning("changelog %s partition %d: records were written at offset %d, below the known end %d; "
                        "is another writer using topic %s?", self.stream, self.partition, first, self._end,
                        self.topic)
        self._pending = []
        self._end = last + 1
        return self._end

    def _commit_transaction(self, timeout: float) -> None:
        # KafkaProducer.commit_transaction() waits without a bound; a hung broker must not hang the
        # commit, so wait on the same result with our deadline (kafka-python internals, 2.1-3.x).
        producer = self._producer
        assert producer is not None
        manager = getattr(producer, "_transaction_manager", None)
        if manager is None or not hasattr(manager, "begin_commit"):
            producer.commit_transaction()
            return
        result = manager.begin_commit()
        producer._sender.wakeup()
        if not result.wait(timeout_ms=int(timeout * 1000)):
            raise _Timeout()

    def _fail(self, reason: str) -> None:
        """Give up the producer: its records may or may not have reached the broker, and are not
        reported. The next writer's init_transactions fences this one."""
        self._failure = reason
        self._pending = []
        if self._producer is not None:
            _close_producer(self._producer)
            self._producer = None

    # ------------------------------------------------------------------ offsets

    def end_offset(self) -> int:
        """The end offset of the data records (see the module docstring), plus the number of
        appended, unflushed records (the broker assigns their exact offsets at flush)."""
        return self.flushed_end() + len(self._pending)

    def flushed_end(self) -> int:
        """Writer: end offset of the acknowledged records (found on the broker once if nothing was
        written). Reader: the end on the broker now (other writers may be appending)."""
        if self._closed:
            raise ChangelogError("changelog partition is closed", **self._where(), hint="open the partition again")
        if not self.writable:
            return self._find_end()
        if self._end is None:
            self._end = self._find_end()
        return self._end

    def _find_end(self) -> int:
        """One past the last data record on the broker: start near what ListOffsets reports (which
        may be below the high watermark, never above it), read forward to the high watermark, and
        step back when the tail holds no data record (a transaction marker)."""
        return find_data_end(self._listed_end(), lambda start: self._fetch(start, None))

    def _listed_end(self) -> int:
        consumer = self._new_consumer()
        try:
            timeout_ms = int(self.system.config["request_timeout"] * 1000)
            return listed_ends(consumer, self.topic, [self.partition], timeout_ms=timeout_ms)[self.partition]
        except KafkaError as exc:
            raise self._error(exc, "find the end of the changelog") from exc
        finally:
            _close_consumer(consumer)

    # ------------------------------------------------------------------ reader

    def read(self, start: int = 0, end: int | None = None) -> Iterator[ChangelogRecord]:
        """Yield the data records with ``start <= offset < end`` in offset order. ``end=None``: up to
        the flushed end for a writer, up to the log end for a reader."""
        for batch in self.read_batches(start, end):
            yield from batch

    def read_batches(self, start: int = 0, end: int | None = None) -> Iterator[list[ChangelogRecord]]:
        """The records of :meth:`read`, one list per fetch."""
        if self._closed:
            raise ChangelogError("changelog partition is closed", **self._where(), hint="open the partition again")
        if end is None and self.writable:
            end = self.flushed_end()
        if end is not None and end <= start:
            return
        make = ChangelogRecord
        for batch in self._fetch(max(0, start), end):
            yield [make(r.key if r.key is not None else b"", r.value, r.offset) for r in batch]

    def _fetch(self, start: int, end: int | None) -> Iterator[list[Any]]:
        """Lists of consumer records with ``start <= offset < end``; ``end=None`` reads up to the
        high watermark reported by the fetch responses of this read. Stops at the high watermark in
        any case. Raises ChangelogError after ``request_timeout`` without progress."""
        # A consumer of its own per read: a reused one can receive the answer to a fetch it sent
        # during an earlier read, before our latest flush, and its stale high watermark would end
        # this read early. Creating one costs a bootstrap round trip (~10 ms on loopback).
        consumer = self._new_consumer()
        tp = self._tp
        stall = self.system.config["request_timeout"]
        try:
            consumer.assign([tp])
            consumer.seek(tp, start)
            position = start
            progress_at = time.monotonic()
            while True:
                if end is not None and position >= end:
                    return
                highwater = consumer.highwater(tp)
                if highwater is not None and position >= highwater:
                    return
                records = consumer.poll(timeout_ms=_POLL_MS).get(tp, [])
                new_position = consumer.position(tp, timeout_ms=int(stall * 1000))
                if records or (new_position is not None and new_position > position):
                    progress_at = time.monotonic()
                elif time.monotonic() - progress_at > stall:
                    raise ChangelogError(
                        f"reading the changelog made no progress at offset {position} for {stall:g} s "
                        f"(log end {'unknown' if highwater is None else highwater}, wanted up to "
                        f"{'the end' if end is None else end})",
                        hint="check the Kafka brokers' health; raise request_timeout if the cluster is just slow",
                        bootstrap_servers=self.system.servers, offset=position, **self._where())
                if new_position is not None:
                    position = max(position, new_position)
                if records and (records[0].offset < start or (end is not None and records[-1].offset >= end)):
                    records = [r for r in records if start <= r.offset and (end is None or r.offset < end)]
                if records:
                    yield records
        except KafkaError as exc:
            name = type(exc).__name__
            if name in ("OffsetOutOfRangeError", "NoOffsetForPartitionError"):
                raise ChangelogError(
                    f"changelog records from offset {start} are no longer on the broker ({name})",
                    hint="the topic lost records: a changelog topic must have cleanup.policy=compact (never "
                         "'delete' or a retention limit); rebuild the job's state with `localstate reset`",
                    bootstrap_servers=self.system.servers, offset=start, **self._where()) from exc
            raise self._error(exc, "read the changelog", offset=start) from exc
        finally:
            _close_consumer(consumer)

    def _new_consumer(self) -> KafkaConsumer:
        config = self.system.config
        try:
            return KafkaConsumer(**consumer_settings(
                self.system.client,
                isolation_level="read_uncommitted",
                fetch_max_wait_ms=20,
                max_partition_fetch_bytes=config["fetch_bytes"],
                fetch_max_bytes=max(config["fetch_bytes"], 52_428_800),
                max_poll_records=10_000,
            ))
        except KafkaError as exc:
            raise self._error(exc, "open a changelog reader") from exc

    # ------------------------------------------------------------------ lifecycle

    def close(self) -> None:
        """Release the producer. Unflushed records are dropped."""
        if self._closed:
            return
        self._closed = True
        self._pending = []
        if self._producer is not None:
            _close_producer(self._producer)
            self._producer = None
        self.system.release_partition(self)

    def __repr__(self) -> str:
        return (f"KafkaChangelogPartition(topic={self.topic!r}, partition={self.partition}, "
                f"writable={self.writable}, end={self._end})")


class _Timeout(Exception):
    """The flush deadline passed."""


def _record(key: Any, value: Any, where: KafkaChangelogPartition) -> tuple[bytes, bytes | None]:
    if not isinstance(key, bytes):
        if not isinstance(key, (bytearray, memoryview)):
            raise ChangelogError(f"cannot append record: key must be bytes, got {type(key).__name__}",
                                 **where._where(), hint="keys and values must be bytes (None value = tombstone)")
        key = bytes(key)
    if value is not None and not isinstance(value, bytes):
        if not isinstance(value, (bytearray, memoryview)):
            raise ChangelogError(f"cannot append record: value must be bytes or None, got {type(value).__name__}",
                                 **where._where(), hint="keys and values must be bytes (None value = tombstone)")
        value = bytes(value)
    return key, value


def _close_producer(producer: KafkaProducer) -> None:
    """Close without waiting: after a successful flush nothing is buffered, and after a failed one
    the buffered records must be dropped (a hung broker must not hang close either)."""
    try:
        producer.close(timeout=0)
    except Exception:  # noqa: BLE001 - KafkaTimeoutError while batches are still incomplete
        sender = getattr(producer, "_sender", None)
        if sender is not None:
            sender.force_close()  # kafka-python internals: stop the I/O thread, fail pending batches
        log.debug("changelog producer closed forcibly", exc_info=True)


def _close_consumer(consumer: KafkaConsumer) -> None:
    try:
        consumer.close(autocommit=False)
    except Exception:  # noqa: BLE001 - closing must not fail the caller
        log.debug("closing a changelog consumer failed", exc_info=True)
