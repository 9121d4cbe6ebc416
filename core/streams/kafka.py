"""Kafka input and output streams for jobs (``system = "kafka"``), with kafka-python: no JVM
connector, no consumer groups, no offsets committed to Kafka.

**Input.** Job partition ``p`` reads topic partition ``p`` (Samza's model), so the topic must have
exactly the job's partition count. The driver plans ``[checkpointed position, end)`` for each
partition with :func:`end_offsets`; the Spark task reads exactly that range with
:func:`read_records` (assign + seek). Positions live in the job checkpoint, never in Kafka.

**Output.** Each record goes to ``partition_for(key, topic partitions)``: murmur2 of the key, the
default partitioner of Kafka's Java producer, so outputs co-partition with inputs and changelogs
(a record without a key goes to the producing task's partition). ``acks=all``; a commit waits
until every record is acknowledged before its checkpoint is written. Kafka cannot take records
back, and a Kafka transaction can only be committed by the producer that opened it, before the
driver writes the checkpoint: delivery and checkpoint cannot be one atomic step. So
:meth:`KafkaOutput.truncate` cannot drop what a failed attempt delivered: state stays
exactly-once, outputs are at-least-once across a crash between the flush and the checkpoint.
Every record carries the headers ``localstate-producer`` (``<job>/<task partition>``) and
``localstate-seq`` (its position in that task partition's output); a record delivered again after
a failure carries the same pair when the task is deterministic, so a consumer can drop duplicates.

The same functions serve the PySpark Data Source ``localstate-kafka``
(:mod:`localstate.core.streams.kafka_source`).
"""

from __future__ import annotations

import atexit
import dataclasses
import logging
import threading
import time
from typing import Any, Callable, ClassVar, Iterable, Iterator, Mapping, Sequence

from localstate.changelog.kafka.client import CONNECTION_OPTIONS, bootstrap_servers, client_settings, kafka_error
from localstate.core.config import JobConfig, StreamConfig
from localstate.core.options import Option, parse_duration
from localstate.core.partitioner import partition_for
from localstate.errors import ConfigError, InputError, LocalStateError, OutputError, SerdeError, TaskError

from .base import InputRecord, InputStream, OutputStream, register_input, register_output

__all__ = ["KafkaInput", "KafkaOutput", "TopicWriter", "end_offsets", "read_range", "read_records",
           "topic_partitions", "ensure_topic", "produce", "copy_input_to_topic", "pooled_consumer", "release_consumer",
           "close_clients", "PRODUCER_HEADER", "SEQ_HEADER"]

log = logging.getLogger(__name__)

PRODUCER_HEADER = "localstate-producer"
SEQ_HEADER = "localstate-seq"

#: Connection options of a stream; ``bootstrap_servers`` may be left out to use ``[changelogs.kafka]``'s.
STREAM_CONNECTION_OPTIONS: dict[str, Option] = {
    **CONNECTION_OPTIONS,
    "bootstrap_servers": dataclasses.replace(
        CONNECTION_OPTIONS["bootstrap_servers"], default=None,
        doc="'host:port[,host:port...]'; default: the connection settings of [changelogs.kafka]"),
}

_SERDE_OPTIONS: dict[str, Option] = {
    "topic": Option(str, default="", doc="Kafka topic (default: the input/output name)"),
    "key_serde": Option(str, default="string", doc="serde of record keys"),
    "value_serde": Option(str, default="json", doc="serde of record values"),
}


# -- clients (one pool per worker process: Python workers are reused across batches) -------------

_LOCK = threading.Lock()
_FREE_CONSUMERS: dict[str, list[Any]] = {}
_PRODUCERS: dict[str, Any] = {}
_ENSURED: set[tuple[str, str]] = set()


def _pool_key(settings: Mapping[str, Any], extra: Mapping[str, Any]) -> str:
    return repr(sorted({**settings, **extra}.items()))


def _consumer_config(settings: Mapping[str, Any]) -> dict[str, Any]:
    return {**settings, "group_id": None, "enable_auto_commit": False, "allow_auto_create_topics": False,
            # Out of range (records deleted by retention) must fail loudly, not silently jump.
            "auto_offset_reset": "none", "fetch_max_wait_ms": 100, "max_poll_records": 5000}


def pooled_consumer(settings: Mapping[str, Any]) -> Any:
    """A KafkaConsumer (no group, no auto-commit, nothing assigned) for ``settings``: from this
    process's pool, or new. Give it back with :func:`release_consumer`. Raises kafka-python errors."""
    from kafka import KafkaConsumer

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


def _producer(settings: Mapping[str, Any], tuning: Mapping[str, Any]) -> Any:
    from kafka import KafkaProducer

    key = _pool_key(settings, tuning)
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


def close_clients() -> None:
    """Close every pooled consumer and producer of this process."""
    with _LOCK:
        consumers = [c for free in _FREE_CONSUMERS.values() for c in free]
        producers = list(_PRODUCERS.values())
        _FREE_CONSUMERS.clear()
        _PRODUCERS.clear()
        _ENSURED.clear()
    for client in consumers + producers:
        try:
            client.close(timeout=1) if client in producers else client.close()
        except Exception:  # noqa: BLE001 - best effort at exit
            log.debug("closing a Kafka client raised", exc_info=True)


atexit.register(close_clients)


# -- shared reading/writing functions (job streams and the Data Source) ---------------------------

def topic_partitions(consumer: Any, topic: str) -> int:
    """Number of partitions of ``topic``; 0 when it does not exist."""
    return len(consumer.partitions_for_topic(topic) or ())


def end_offsets(consumer: Any, topic: str, partitions: Sequence[int], known: Mapping[int, int] | None = None,
                *, timeout: float = 2.0) -> dict[int, int]:
    """The end (high watermark) of each partition: the offset after its last record.

    ListOffsets(latest) is only a floor here: Tansu answers the base offset of the last batch + 1
    instead of the high watermark. So each partition is fetched from one offset *below* the
    floor, where a record is known to exist (the floor is raised to the ``known`` ends, e.g. of a
    previous plan): the fetch is never empty, and its response carries the high watermark and any
    later records. A too-low answer can therefore only delay records to a later plan, and a run
    that plans until nothing is left drains everything. Partitions that return nothing within
    ``timeout`` (their last record compacted away or deleted) keep the floor. Uses ``consumer``
    exclusively.
    """
    from kafka import TopicPartition

    known = known or {}
    tps = [TopicPartition(topic, p) for p in partitions]
    reported = consumer.end_offsets(tps)
    ends = {tp.partition: max(int(reported.get(tp) or 0), int(known.get(tp.partition, 0))) for tp in tps}
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


def read_range(consumer: Any, topic: str, partition: int, start: int, end: int, *, timeout: float,
               on_stall: Callable[[int], LocalStateError]) -> Iterator[Any]:
    """Yield the kafka-python records of ``topic[partition]`` with ``start <= offset < end``, in
    order, using ``consumer`` exclusively. Gaps (compaction, transaction markers) are skipped.
    When no progress is made for ``timeout`` seconds, raises ``on_stall(position)``."""
    if start >= end:
        return
    from kafka import TopicPartition

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
                 create: bool) -> int:
    """The partition count of ``topic``, creating it with ``partitions`` partitions when missing
    and ``create`` is true. Returns 0 when it is missing and may not be created. Raises
    kafka-python errors."""
    from kafka import KafkaAdminClient
    from kafka.admin import NewTopic
    from kafka.errors import TopicAlreadyExistsError

    consumer = pooled_consumer(settings)
    ok = False
    try:
        count = topic_partitions(consumer, topic)
        if count == 0 and create:
            admin = KafkaAdminClient(**settings)
            try:
                admin.create_topics([NewTopic(topic, partitions, replication_factor)])
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
        """This process's pooled producer for these settings (a new one after a failure)."""
        if self._producer is None:
            try:
                self._producer = _producer(self.settings, self._tuning)
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
            self.producer.flush(timeout=self.delivery_timeout)
            for future in futures:
                if not future.is_done:
                    raise TimeoutError(f"{sum(not f.is_done for f in futures)} record(s) not acknowledged "
                                       f"within {self.delivery_timeout:g}s")
                if future.failed():
                    raise future.exception
        except LocalStateError:
            raise
        except Exception as exc:  # noqa: BLE001
            raise self._fail(exc, "deliver records to") from exc
        return len(futures)


# -- job streams -----------------------------------------------------------------------------------

def _connection(job: JobConfig, section: str, name: str, validated: Mapping[str, Any],
                raw: Mapping[str, Any]) -> dict[str, Any]:
    """kafka-python settings of a stream: its own connection options, or those of
    ``[changelogs.kafka]`` (overridden by any the stream sets itself)."""
    options = {k: validated[k] for k in CONNECTION_OPTIONS}
    if options["bootstrap_servers"] is None:
        shared = job.changelog_options.get("kafka") or {}
        if not shared.get("bootstrap_servers"):
            raise ConfigError.at(f"{section}.{name}.bootstrap_servers", "required option is missing",
                                 hint="set bootstrap_servers here, or in [changelogs.kafka] to share it")
        options = {k: (validated[k] if k in raw else shared.get(k, validated[k])) for k in CONNECTION_OPTIONS}
    return client_settings(options, path=f"{section}.{name}")


@register_input
class KafkaInput(InputStream):
    """``[inputs.<name>] system = "kafka"``: topic partition ``p`` feeds job partition ``p``."""

    system = "kafka"
    options: ClassVar[Mapping[str, Option]] = {
        **STREAM_CONNECTION_OPTIONS,
        **_SERDE_OPTIONS,
        "ts_field": Option(str, default="ts", doc="value field holding the event time (seconds); records "
                                                  "without it use their Kafka timestamp"),
        "allow_null_keys": Option(bool, default=False, doc="accept records without a key (else they are bad "
                                                           "records, handled by on_error)"),
        "probe_timeout": Option((int, float, str), default=2.0, parse=parse_duration, minimum=0.01,
                                doc="how long the driver waits for a partition's end when planning"),
    }

    def location(self) -> tuple[str, str]:
        return "kafka", self.topic

    def __init__(self, job: JobConfig, config: StreamConfig) -> None:
        super().__init__(job, config)
        self.topic = self.config["topic"] or self.name
        self.settings = _connection(job, "inputs", self.name, self.config, config.options)
        self.servers = bootstrap_servers(self.settings)
        registry = job.registry
        self.key_serde = registry.serde(self.config["key_serde"], allow_pickle=job.allow_pickle)
        self.value_serde = registry.serde(self.config["value_serde"], allow_pickle=job.allow_pickle)
        self._ends: dict[int, int] = {}
        self._served: set[int] | None = None

    # driver side ------------------------------------------------------------------------------
    def _error(self, exc: BaseException, action: str, **context: Any) -> InputError:
        return kafka_error(exc, action, self.servers, error=InputError, stream=self.name,  # type: ignore[return-value]
                           topic=self.topic, **context)

    def check_topic(self, consumer: Any) -> None:
        """Raise InputError unless the topic exists with exactly the job's partition count."""
        count = topic_partitions(consumer, self.topic)
        partitions = self.job.partitions
        if count == 0:
            raise InputError(f"input topic {self.topic!r} does not exist on {self.servers}", stream=self.name,
                             topic=self.topic, bootstrap_servers=self.servers,
                             hint=f"create it with {partitions} partition(s) (one per job partition), or set "
                                  f"[inputs.{self.name}] topic to the right name")
        if count != partitions:
            raise InputError(
                f"input topic {self.topic!r} has {count} partition(s) but the job has {partitions}: job partition p "
                f"reads topic partition p, so the counts must be equal", stream=self.name, topic=self.topic,
                bootstrap_servers=self.servers,
                hint=f"set [job] partitions = {count} (only for a job without state yet), or feed the job from a "
                     f"topic with {partitions} partitions (e.g. re-partition the records by key with the murmur2 "
                     f"partitioner)")

    def end_offset(self, partition: int) -> int:
        # The runner asks partition by partition; all ends are found with one probe, refreshed when
        # a partition is asked again (the next plan).
        if self._served is None or partition in self._served:
            self._refresh()
        assert self._served is not None
        self._served.add(partition)
        return self._ends.get(partition, 0)

    def _refresh(self) -> None:
        consumer, ok = None, False
        try:
            consumer = pooled_consumer(self.settings)
            self.check_topic(consumer)
            self._ends = end_offsets(consumer, self.topic, range(self.job.partitions), self._ends,
                                     timeout=self.config["probe_timeout"])
            ok = True
        except LocalStateError:
            ok = True
            raise
        except Exception as exc:  # noqa: BLE001 - every kafka-python failure becomes a typed error
            raise self._error(exc, f"plan input {self.name!r} from Kafka topic {self.topic!r}") from exc
        finally:
            if consumer is not None:
                release_consumer(self.settings, consumer, ok)
        self._served = set()

    # executor side ----------------------------------------------------------------------------
    def read(self, partition: int, start: int, end: int) -> Iterator[InputRecord]:
        decode_key, decode_value = self.key_serde.deserialize, self.value_serde.deserialize
        ts_field, allow_null = self.config["ts_field"], self.config["allow_null_keys"]
        for record in read_records(self.settings, self.topic, partition, start, end, stream=self.name):
            if record.key is None and not allow_null:
                yield InputRecord(record.offset, None, None, None, "missing key", repr(record.value)[:1000])
                continue
            try:
                key = decode_key(record.key) if record.key is not None else None
                value = decode_value(record.value) if record.value is not None else None
            except SerdeError as exc:
                yield InputRecord(record.offset, None, None, None, f"undecodable: {exc.message}",
                                  repr((record.key, record.value))[:1000])
                continue
            ts = value.get(ts_field) if isinstance(value, dict) else None
            if not isinstance(ts, (int, float)) or isinstance(ts, bool):
                ts = record.timestamp / 1000 if record.timestamp is not None and record.timestamp >= 0 else None
            yield InputRecord(record.offset, key, value, float(ts) if ts is not None else None)


_DELIVERED: dict[tuple[str, str, str, int], int] = {}
"""(servers, topic, job, task partition) -> records this process delivered (for the rollback warning)."""


@register_output
class KafkaOutput(OutputStream):
    """``[outputs.<name>] system = "kafka"``: keyed records, partitioned by murmur2 of the key.

    The position kept in the checkpoint is the number of records the task partition has delivered
    to this output; it numbers the ``localstate-seq`` headers."""

    system = "kafka"
    exactly_once = False
    options: ClassVar[Mapping[str, Option]] = {
        **STREAM_CONNECTION_OPTIONS,
        **_SERDE_OPTIONS,
        "create": Option(bool, default=True, doc="create the topic when it does not exist"),
        "partitions": Option(int, default=0, minimum=0, doc="partitions of a created topic (0: the job's)"),
        "replication_factor": Option(int, default=-1, minimum=-1,
                                     doc="replication factor of a created topic (-1: the broker default)"),
        "linger": Option((int, float, str), default=0.005, parse=parse_duration,
                         doc="how long the producer waits to fill a batch ('5ms')"),
        "compression": Option(str, default=None, choices=(None, "gzip", "snappy", "lz4", "zstd"),
                              doc="compression of record batches"),
        "delivery_timeout": Option((int, float, str), default=30.0, parse=parse_duration, minimum=0.1,
                                   doc="a commit fails when its records are not acknowledged within this"),
        "headers": Option(bool, default=True, doc="add the localstate-producer/localstate-seq headers "
                                                  "(duplicate detection)"),
    }

    def location(self) -> tuple[str, str]:
        return "kafka", self.topic

    def __init__(self, job: JobConfig, config: StreamConfig) -> None:
        super().__init__(job, config)
        self.topic = self.config["topic"] or self.name
        self.settings = _connection(job, "outputs", self.name, self.config, config.options)
        self.servers = bootstrap_servers(self.settings)
        registry = job.registry
        self.key_serde = registry.serde(self.config["key_serde"], allow_pickle=job.allow_pickle)
        self.value_serde = registry.serde(self.config["value_serde"], allow_pickle=job.allow_pickle)
        self._counts: dict[int, int] = {}
        self._writer: TopicWriter | None = None
        self._partitions = 0

    def _topic_writer(self) -> tuple[TopicWriter, int]:
        if self._writer is None:
            ensured = (self.servers, self.topic)
            if ensured not in _ENSURED:
                try:
                    count = ensure_topic(self.settings, self.topic, self.config["partitions"] or self.job.partitions,
                                         self.config["replication_factor"], self.config["create"])
                except Exception as exc:  # noqa: BLE001
                    raise kafka_error(exc, f"check output topic {self.topic!r}", self.servers,
                                      error=OutputError, stream=self.name, topic=self.topic) from exc
                if count == 0:
                    raise OutputError(f"output topic {self.topic!r} does not exist on {self.servers}",
                                      stream=self.name, topic=self.topic,
                                      hint=f"create it, or set [outputs.{self.name}] create = true")
                with _LOCK:
                    _ENSURED.add(ensured)
            c = self.config
            self._writer = TopicWriter(self.settings, self.topic, linger=c["linger"], compression=c["compression"],
                                       delivery_timeout=c["delivery_timeout"], stream=self.name)
            self._partitions = self._writer.partitions()
        return self._writer, self._partitions

    def end_offset(self, partition: int) -> int:
        return self._counts.get(partition, 0)

    def truncate(self, partition: int, position: int) -> int:
        """Kafka cannot drop records: keep ``position`` (the checkpointed count) as the base of the
        sequence numbers and return it. Records delivered after that checkpoint stay in the topic
        and are delivered again by the replay (at-least-once); when this process delivered them,
        a warning says how many."""
        delivered = _DELIVERED.get((self.servers, self.topic, self.job.name, partition), 0)
        if delivered > position:
            log.warning("output %s: %d record(s) of partition %d already delivered to Kafka topic %s after the last "
                        "checkpoint cannot be taken back and will be delivered again (at-least-once; duplicates carry "
                        "the same %s/%s headers)", self.name, delivered - position, partition, self.topic,
                        PRODUCER_HEADER, SEQ_HEADER)
        self._counts[partition] = position
        return position

    def append(self, partition: int, items: list[tuple[Any, Any]]) -> int:
        seq = self._counts.get(partition, 0)
        if not items:
            return seq
        encode_key, encode_value = self.key_serde.serialize, self.value_serde.serialize
        try:  # encode everything before sending anything: a bad record must not leave half a batch
            encoded = [(key, encode_key(key) if key is not None else None,
                        encode_value(value) if value is not None else None) for key, value in items]
        except SerdeError as exc:
            raise TaskError(f"cannot encode a record for output {self.name!r}: {exc.message}", stream=self.name,
                            partition=partition,
                            hint=f"send keys/values that key_serde {self.config['key_serde']!r} and value_serde "
                                 f"{self.config['value_serde']!r} of [outputs.{self.name}] accept, or change "
                                 f"them") from exc
        writer, count = self._topic_writer()
        producer_id = f"{self.job.name}/{partition}".encode()
        headers = self.config["headers"]
        for key, data_key, data_value in encoded:
            target = partition_for(key, count) if key is not None else partition % count
            writer.send(data_key, data_value, target,
                        [(PRODUCER_HEADER, producer_id), (SEQ_HEADER, str(seq).encode())] if headers else None)
            seq += 1
        writer.flush()
        self._counts[partition] = seq
        _DELIVERED[(self.servers, self.topic, self.job.name, partition)] = seq
        return seq

    def read(self, partition: int) -> Iterator[tuple[Any, Any]]:
        """Every record of *topic* partition ``partition`` as ``(key, value)``."""
        for record in self.records(partition):
            yield (self.key_serde.deserialize(record.key) if record.key is not None else None,
                   self.value_serde.deserialize(record.value) if record.value is not None else None)

    def records(self, partition: int) -> Iterator[Any]:
        """The raw kafka-python records (with headers) of topic partition ``partition``."""
        consumer = pooled_consumer(self.settings)
        try:
            end = end_offsets(consumer, self.topic, [partition])[partition]
        finally:
            release_consumer(self.settings, consumer)
        yield from read_records(self.settings, self.topic, partition, 0, end, error=OutputError, stream=self.name)

    def topic_partitions(self) -> int:
        """Partitions of the output topic (0 when it does not exist yet)."""
        consumer = pooled_consumer(self.settings)
        try:
            return topic_partitions(consumer, self.topic)
        finally:
            release_consumer(self.settings, consumer)


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


def copy_input_to_topic(job: JobConfig, name: str, settings: Mapping[str, Any], topic: str, *,
                        key_serde: str = "string", value_serde: str = "json", replication_factor: int = -1) -> int:
    """Copy every record of input ``name`` of ``job`` (a generator, file or JSON-lines input) into
    ``topic``, partition ``p`` to topic partition ``p``, creating the topic with the job's partition
    count when missing. For demos and tests: it fills the topics of a job's Kafka variant with the
    very records of its original inputs. Returns the number of records copied."""
    from .base import open_input

    source = open_input(job, name)
    registry = job.registry
    encode_key = registry.serde(key_serde, allow_pickle=job.allow_pickle).serialize
    encode_value = registry.serde(value_serde, allow_pickle=job.allow_pickle).serialize
    count = ensure_topic(settings, topic, job.partitions, replication_factor, create=True)
    if count != job.partitions:
        raise InputError(f"topic {topic!r} has {count} partition(s), the job {job.partitions}", topic=topic,
                         hint="delete the topic or use another name")

    def records() -> Iterator[tuple[bytes | None, bytes | None, int]]:
        for partition in range(job.partitions):
            for record in source.read(partition, 0, source.end_offset(partition)):
                if record.error is None:
                    yield (encode_key(record.key) if record.key is not None else None,
                           encode_value(record.value) if record.value is not None else None, partition)

    return produce(settings, topic, records())

