"""Kafka input and output streams for jobs (``system = "kafka"``), with kafka-python: no JVM
connector, no consumer groups, no offsets committed to Kafka.

**Input.** Job partition ``p`` reads topic partition ``p`` (Samza's model), so the topic must have
exactly the job's partition count. The driver plans ``[checkpointed position, end)`` for each
partition with :func:`end_offsets`; the Spark task reads exactly that range with
:func:`read_records` (assign + seek). Positions live in the job checkpoint, never in Kafka.

**Output.** Each record goes to ``partition_for(key, topic partitions)``: murmur2 of the key, the
default partitioner of Kafka's Java producer, so outputs co-partition with inputs and changelogs
(a record without a key goes to the producing task's partition). ``acks=all``. With
``transactions = true`` (the default) outputs are exactly-once for ``read_committed`` consumers, by
Flink's two-phase commit (:mod:`.transactions`): each commit's records go in one Kafka transaction
of the task partition's transactional producer, which stays open while the checkpoint is written
and is committed once it is durable; a restart commits the transaction its checkpoint names, then
``init_transactions()`` aborts whatever a crashed attempt left open after it. With
``transactions = false`` (brokers without transactions) a commit waits until every record is
acknowledged and Kafka cannot take records back: outputs are at-least-once across a crash between
the flush and the checkpoint. Every record carries the headers ``localstate-producer``
(``<job>/<task partition>``) and ``localstate-seq`` (its position in that task partition's output);
a record delivered again after a failure carries the same pair when the task is deterministic, so
a consumer can drop duplicates.

The same functions serve the PySpark Data Source ``localstate-kafka``
(:mod:`localstate.runtime.spark.kafka_source`); the Kafka I/O itself is
:mod:`localstate.changelog.kafka.io`, shared with the Kafka changelog.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, ClassVar, Iterator, Mapping

from kafka import KafkaProducer

from localstate.core.config import JobConfig, StreamConfig
from localstate.core.options import Option, parse_duration
from localstate.core.partitioner import partition_for
from localstate.core.routing import ROUTING_OPTIONS
from localstate.core.stream import BadTimestamp, InputColumns, InputRecord, InputStream, OutputStream, \
    StreamSystem, columns_of, open_input
from localstate.errors import ConfigError, InputError, LocalStateError, OutputError, SerdeError, TaskError

from .client import CONNECTION_OPTIONS, bootstrap_servers, client_settings, kafka_error
from .transactions import FENCED, commit_recorded, recorded
from .io import (TopicFollower, TopicWriter, close_clients, end_offsets, ensure_topic, pooled_consumer, produce,
                 read_range, read_records, release_consumer, remember_topic, start_offsets, topic_checked, topic_id,
                 topic_partitions, wait_acknowledged)

__all__ = ["KafkaStreams", "KafkaInput", "KafkaOutput", "TopicWriter", "end_offsets", "read_range", "read_records",
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


class _KafkaTopic:
    """What a Kafka input and a Kafka output share: the topic (``topic``, default the stream's name),
    the connection settings (:func:`_connection`) and the record serdes."""

    section: ClassVar[str]
    """the stream's job-config table: ``"inputs"`` or ``"outputs"``"""
    name: str
    config: Mapping[str, Any]

    def _open_topic(self, job: JobConfig, config: StreamConfig) -> None:
        self.topic = self.config["topic"] or self.name
        self.settings = _connection(job, self.section, self.name, self.config, config.options)
        self.servers = bootstrap_servers(self.settings)
        registry = job.registry
        self.key_serde = registry.serde(self.config["key_serde"], allow_pickle=job.allow_pickle)
        self.value_serde = registry.serde(self.config["value_serde"], allow_pickle=job.allow_pickle)

    def location(self) -> tuple[str, str]:
        return "kafka", self.topic


class KafkaInput(_KafkaTopic, InputStream):
    """``[inputs.<name>] system = "kafka"``: topic partition ``p`` feeds job partition ``p``. Its
    identity (:class:`~localstate.core.stream.IdentifiedInput`) is the topic's id. A continuous task
    follows it (:class:`~localstate.core.stream.FollowedInput`) with one consumer kept assigned, whose
    long-poll fetches wake the task (:class:`~localstate.core.stream.WaitableInput`), give the ends and
    bring the records its reads hand out."""

    system = "kafka"
    section = "inputs"
    options: ClassVar[Mapping[str, Option]] = {
        **STREAM_CONNECTION_OPTIONS,
        **_SERDE_OPTIONS,
        "ts_field": Option(str, default="ts", doc="value field holding the event time (in timestamp_unit); records "
                                                  "without it use their Kafka timestamp (milliseconds)"),
        "allow_null_keys": Option(bool, default=False, doc="accept records without a key (else they are bad "
                                                           "records, handled by on_error)"),
        "probe_timeout": Option((int, float, str), default=2.0, parse=parse_duration, minimum=0.01,
                                doc="how long the driver waits for a partition's end when planning"),
        **ROUTING_OPTIONS,
    }

    def __init__(self, job: JobConfig, config: StreamConfig) -> None:
        super().__init__(job, config)
        self._open_topic(job, config)
        self._ends: dict[int, int] = {}
        self._starts: dict[int, int] = {}
        self._served: set[int] | None = None
        self._topic_id: str | None = None
        self._follower = TopicFollower(self.settings, self.topic)

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

    def start_offset(self, partition: int) -> int:
        """The partition's log start offset as of the last :meth:`end_offset` probe (probing now if
        there was none): records below it were deleted (retention, DeleteRecords, a re-created topic
        that starts higher). See :class:`~localstate.core.stream.RetainedStart`."""
        if self._served is None:
            self._refresh()
        return min(self._starts.get(partition, 0), self._ends.get(partition, 0))

    def identity(self, partition: int = 0, recorded: str | None = None) -> str | None:
        """The topic's id as of the last :meth:`end_offset` probe (probing now if there was none), the
        same for every partition; None if the broker names none (see
        :class:`~localstate.core.stream.IdentifiedInput`)."""
        if self._served is None:
            self._refresh()
        return self._topic_id

    def _refresh(self) -> None:
        consumer, ok = None, False
        try:
            consumer = pooled_consumer(self.settings)
            self.check_topic(consumer)
            self._topic_id = topic_id(consumer, self.topic)
            self._ends = end_offsets(consumer, self.topic, range(self.job.partitions), self._ends,
                                     timeout=self.config["probe_timeout"])
            self._starts = start_offsets(consumer, self.topic, range(self.job.partitions))
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
    def follow_end(self, partitions: Mapping[int, int]) -> dict[int, int]:
        """See :class:`~localstate.core.stream.FollowedInput`: the ends of ``partitions`` (partition ->
        position) as this input's follower last saw them (:class:`~.io.TopicFollower`: one consumer
        kept assigned, whose fetches bring the records a following :meth:`read` hands out), with no
        end probe. Any broker error is raised as InputError."""
        try:
            return self._follower.end(partitions)
        except Exception as exc:  # noqa: BLE001 - every kafka-python failure becomes a typed error
            raise self._error(exc, f"follow input {self.name!r}") from exc

    def wakes_at_once(self) -> bool:
        """Yes, within :data:`~.io.BUSY_FETCH_MS` while records keep arriving: the follower's fetch
        waits that long at most at the broker then (and :data:`~.io.WAIT_FETCH_MS` once idle)."""
        return True

    def can_wait(self) -> bool:
        """Always: a broker that cannot be reached makes :meth:`wait_for_records` raise instead."""
        return True

    def wait_for_records(self, positions: dict[int, int], timeout: float) -> bool:
        """See :class:`~localstate.core.stream.WaitableInput`: the follower's fetch waits at the broker,
        and what it brings is kept for the next :meth:`read`. Any broker error is raised as
        InputError (the caller sleeps instead; its next end probe reports what is wrong)."""
        try:
            return self._follower.wait(positions, timeout)
        except Exception as exc:  # noqa: BLE001 - every kafka-python failure becomes a typed error
            raise self._error(exc, f"wait for records of input {self.name!r}") from exc

    def close(self) -> None:
        """Close the following consumer (the pooled ones are this process's, not the input's)."""
        self._follower.close()

    def read_columns(self, partition: int, start: int, end: int) -> Iterator[InputColumns]:
        """:meth:`read` as :class:`~localstate.core.stream.InputColumns` chunks (a batch task's
        input): each record decoded by the stream's serdes as for :meth:`read`, no record tuple per
        decodable row."""
        return columns_of(self.read(partition, start, end))

    def read(self, partition: int, start: int, end: int) -> Iterator[InputRecord]:
        decode_key, decode_value = self.key_serde.deserialize, self.value_serde.deserialize
        ts_field, allow_null = self.config["ts_field"], self.config["allow_null_keys"]
        seconds = self.timestamps.seconds
        for record in self._raw(partition, start, end):
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
            try:
                if ts is not None:
                    ts = seconds(ts)
                elif record.timestamp is not None and record.timestamp >= 0:  # Kafka's: milliseconds
                    ts = seconds(record.timestamp, 1e3)
            except BadTimestamp as exc:
                yield InputRecord(record.offset, None, None, None, exc.problem, repr((record.key, record.value))[:1000])
                continue
            yield InputRecord(record.offset, key, value, ts)


    def _raw(self, partition: int, start: int, end: int) -> Iterator[Any]:
        """The kafka-python records of ``[start, end)``: from the follower when it follows the partition
        from ``start`` (a continuous run), else with a pooled consumer (a planned batch)."""
        if not self._follower.following(partition, start):
            yield from read_records(self.settings, self.topic, partition, start, end, stream=self.name)
            return
        timeout = self.settings["request_timeout_ms"] / 1000
        where = {"topic": self.topic, "partition": partition, "stream": self.name}

        def stalled(position: int) -> LocalStateError:
            return InputError(f"Kafka topic {self.topic!r} partition {partition} returned nothing at offset "
                              f"{position} for {timeout:.0f}s although records up to offset {end} were seen",
                              offset=position, bootstrap_servers=self.servers, **where,
                              hint="check the broker's health; if the records were deleted (retention, topic "
                                   "re-created), the positions that point at them cannot be read any more")

        try:
            yield from self._follower.records(partition, start, end, timeout=timeout, on_stall=stalled)
        except LocalStateError:
            raise
        except Exception as exc:  # noqa: BLE001 - every kafka-python failure becomes a typed error
            raise self._error(exc, f"read input {self.name!r}", partition=partition, offset=start) from exc


_DELIVERED: dict[tuple[str, str, str, int], int] = {}
"""(servers, topic, job, task partition) -> records this process delivered (for the rollback warning)."""


class KafkaOutput(_KafkaTopic, OutputStream):
    """``[outputs.<name>] system = "kafka"``: keyed records, partitioned by murmur2 of the key.

    The position kept in the checkpoint is the number of records the task partition has delivered
    to this output; it numbers the ``localstate-seq`` headers. Transactional (the default): one
    producer per task partition and slot (:meth:`transactional_id`:
    ``<prefix><job>.<output>.<task partition>.<0|1>``);
    :meth:`append` leaves its transaction open (:meth:`pending`), :meth:`commit` or
    :func:`~.transactions.commit_recorded` commits it once the checkpoint naming it is saved."""

    system = "kafka"
    section = "outputs"
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
        "transactions": Option(bool, default=True,
                               doc="exactly-once for read_committed consumers: each commit's records in a Kafka "
                                   "transaction committed once its checkpoint is saved (needs transactional.id "
                                   "ACLs); false: at-least-once without transactions"),
        "transactional_id_prefix": Option(str, default=None,
                                          doc="transactional.id = <prefix><job>.<output>.<task partition>.<0|1>; "
                                              "default: [changelogs.kafka]'s (localstate-)"),
        "transaction_timeout": Option((int, float, str), default=900.0, parse=parse_duration, minimum=1.0,
                                      doc="the broker aborts a transaction open longer ('15m'): a crashed job must "
                                          "restart within it; at most the broker's transaction.max.timeout.ms"),
    }

    def __init__(self, job: JobConfig, config: StreamConfig) -> None:
        super().__init__(job, config)
        self._open_topic(job, config)
        self._counts: dict[int, int] = {}
        self._writer: TopicWriter | None = None
        self._partitions = 0
        self.transactional: bool = self.config["transactions"]
        self.exactly_once = self.transactional
        prefix = self.config["transactional_id_prefix"]
        if prefix is None:
            prefix = (job.changelog_options.get("kafka") or {}).get("transactional_id_prefix") or "localstate-"
        self.transactional_id_prefix: str = prefix
        self._producers: dict[tuple[int, int], Any] = {}  # (task partition, slot) -> transactional producer
        self._pending: dict[int, dict[str, Any]] = {}  # task partition -> its open transaction (recorded)
        self._open: set[tuple[int, int]] = set()  # (task partition, slot) whose producer is in a transaction
        self._slot: dict[int, int] = {}  # task partition -> the slot of its last transaction

    def _check_topic(self) -> None:
        if topic_checked(self.servers, self.topic):
            return
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
        remember_topic(self.servers, self.topic)

    def _topic_writer(self) -> tuple[TopicWriter, int]:
        if self._writer is None:
            self._check_topic()
            c = self.config
            self._writer = TopicWriter(self.settings, self.topic, linger=c["linger"], compression=c["compression"],
                                       delivery_timeout=c["delivery_timeout"], stream=self.name)
            self._partitions = self._writer.partitions()
        return self._writer, self._partitions

    # -- transactions ----------------------------------------------------------------------------
    def transactional_id(self, partition: int, slot: int = 0) -> str:
        """``slot`` 0 or 1: a task partition's transactions alternate between two transactional
        ids. A producer keeps its id and epoch from one transaction to the next, so a recorded
        (id, producer id, epoch) names "the open transaction of that id"; alternating, the one
        transaction that may be open after the last saved checkpoint is never on the id it
        recorded, and committing that record again cannot commit it (Flink rotates its ids too)."""
        return f"{self.transactional_id_prefix}{self.job.name}.{self.name}.{partition}.{slot}"

    def _txn_error(self, exc: BaseException, action: str, partition: int, slot: int) -> OutputError:
        tid = self.transactional_id(partition, slot)
        if type(exc).__name__ in FENCED:
            return OutputError(
                f"output {self.name!r}: cannot {action}: a newer producer with transactional id {tid!r} took over "
                f"task partition {partition} ({type(exc).__name__})", stream=self.name, topic=self.topic,
                partition=partition, transactional_id=tid, bootstrap_servers=self.servers,
                hint="another instance of this task partition is running (this one is a zombie): stop this one; "
                     "its uncommitted outputs are aborted and the newer instance produces them again")
        return kafka_error(exc, f"{action} Kafka topic {self.topic} (transactional id {tid!r})",  # type: ignore
                           self.servers, error=OutputError, stream=self.name, topic=self.topic, partition=partition,
                           transactional_id=tid)

    def _producer(self, partition: int, slot: int) -> Any:
        """The transactional producer of ``(partition, slot)``, opened with ``init_transactions()``:
        that fences every older producer of its transactional id and aborts what it left open."""
        producer = self._producers.get((partition, slot))
        if producer is not None:
            return producer
        self._check_topic()
        c = self.config
        request_ms = int(self.settings.get("request_timeout_ms", 30000))
        try:
            producer = KafkaProducer(
                **self.settings, acks="all", enable_idempotence=True, linger_ms=int(c["linger"] * 1000),
                compression_type=c["compression"], batch_size=256 * 1024, allow_auto_create_topics=False,
                max_block_ms=int(c["delivery_timeout"] * 1000),
                delivery_timeout_ms=max(int(c["delivery_timeout"] * 1000), request_ms + int(c["linger"] * 1000)),
                transactional_id=self.transactional_id(partition, slot),
                transaction_timeout_ms=int(c["transaction_timeout"] * 1000))
        except Exception as exc:  # noqa: BLE001
            raise self._txn_error(exc, "connect to", partition, slot) from exc
        try:
            producer.init_transactions()
            self._partitions = len(producer.partitions_for(self.topic) or ())
        except Exception as exc:  # noqa: BLE001
            producer.close(timeout=0)
            raise self._txn_error(exc, "initialise the transactions of", partition, slot) from exc
        self._producers[(partition, slot)] = producer
        return producer

    def _discard(self, partition: int) -> None:
        """Drop the partition's producers after a failure: nothing they still buffer may reach
        Kafka, and their open transactions are aborted by the next ``init_transactions()`` (or time out)."""
        self._pending.pop(partition, None)
        for slot in (0, 1):
            self._open.discard((partition, slot))
            producer = self._producers.pop((partition, slot), None)
            if producer is not None:
                try:
                    producer.close(timeout=0)
                except Exception:  # noqa: BLE001 - closing a broken producer may fail again
                    log.debug("closing a failed producer raised", exc_info=True)

    def pending(self, partition: int) -> dict[str, Any] | None:
        """The open transaction of the last :meth:`append` with records, not committed yet (what
        the checkpoint records), or None."""
        return self._pending.get(partition)

    def commit(self, partition: int) -> None:
        """Commit the open transaction of ``partition`` with the live producer: call once the
        checkpoint naming it is saved."""
        if self._pending.pop(partition, None) is None:
            return
        slot = self._slot[partition]
        try:
            _commit_transaction(self._producers[(partition, slot)], self.config["delivery_timeout"])
        except Exception as exc:  # noqa: BLE001
            error = self._txn_error(exc, "commit the transaction of", partition, slot)
            self._discard(partition)
            raise error from exc
        self._open.discard((partition, slot))

    def commit_recorded(self, partition: int, pending: Mapping[str, Any]) -> None:
        """Commit a transaction a checkpoint recorded, from any process (see :mod:`.transactions`)."""
        commit_recorded(self.settings, pending, stream=self.name, topic=self.topic, partition=partition)
        for slot in (0, 1):
            if pending["id"] == self.transactional_id(partition, slot):
                self._slot[partition] = slot  # the next transaction goes on the other id

    def fence(self, partition: int) -> None:
        """Open the task partition's producers now (``init_transactions()``): fences older
        instances and aborts what they left open. Call after the recorded transaction was committed.
        The id of that transaction is left alone (opened when next used): a new epoch there would
        make a second commit of the record, by a restart from the same checkpoint, fail as fenced;
        what may be open after that checkpoint is on the other id anyway."""
        if self.transactional:
            recorded_slot = self._slot.get(partition)
            for slot in (0, 1):
                if slot != recorded_slot:
                    self._producer(partition, slot)

    # -- stream ----------------------------------------------------------------------------------
    def end_offset(self, partition: int) -> int:
        return self._counts.get(partition, 0)

    def truncate(self, partition: int, position: int) -> int:
        """Kafka cannot drop records: keep ``position`` (the checkpointed count) as the base of the
        sequence numbers and return it. Transactional, what was written after that checkpoint is in
        transactions that :meth:`fence` aborts. Otherwise those records stay in the topic and are
        delivered again by the replay (at-least-once); when this process delivered them, a warning
        says how many."""
        delivered = _DELIVERED.get((self.servers, self.topic, self.job.name, partition), 0)
        if delivered > position and not self.transactional:
            log.warning("output %s: %d record(s) of partition %d already delivered to Kafka topic %s after the last "
                        "checkpoint cannot be taken back and will be delivered again (at-least-once; duplicates carry "
                        "the same %s/%s headers)", self.name, delivered - position, partition, self.topic,
                        PRODUCER_HEADER, SEQ_HEADER)
        self._counts[partition] = position
        return position

    def append(self, partition: int, items: list[tuple[Any, Any]]) -> int:
        """Deliver ``items``, every one acknowledged on return. Transactional, in a new transaction
        left open (:meth:`pending`); a transaction still open from the previous append is committed
        first: the runtime appends again only once the checkpoint naming it is saved (the Spark
        driver committed it already, so this commit is a harmless repeat)."""
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
        if self.transactional:
            return self._append_transaction(partition, encoded, seq)
        writer, count = self._topic_writer()
        for data_key, data_value, target, headers in self._records(partition, encoded, seq, count):
            writer.send(data_key, data_value, target, headers)
        writer.flush()
        seq += len(encoded)
        self._counts[partition] = seq
        _DELIVERED[(self.servers, self.topic, self.job.name, partition)] = seq
        return seq

    def _records(self, partition: int, encoded: list[tuple[Any, Any, Any]], seq: int,
                 count: int) -> Iterator[tuple[Any, Any, int, list[tuple[str, bytes]] | None]]:
        """(key, value, topic partition, headers) of each encoded record, numbered from ``seq``."""
        producer_id = f"{self.job.name}/{partition}".encode()
        headers = self.config["headers"]
        for key, data_key, data_value in encoded:
            target = partition_for(key, count) if key is not None else partition % count
            yield (data_key, data_value, target,
                   [(PRODUCER_HEADER, producer_id), (SEQ_HEADER, str(seq).encode())] if headers else None)
            seq += 1

    def _append_transaction(self, partition: int, encoded: list[tuple[Any, Any, Any]], seq: int) -> int:
        slot = 1 - self._slot.get(partition, 1)  # the other id than the last transaction's
        producer = self._producer(partition, slot)
        action = "commit the previous transaction of"
        try:
            if (partition, slot) in self._open:
                # the runtime saved its checkpoint (and committed it) already: a harmless repeat
                _commit_transaction(producer, self.config["delivery_timeout"])
                self._open.discard((partition, slot))
            action = "send to"
            producer.begin_transaction()
            self._open.add((partition, slot))
            futures = [producer.send(self.topic, key=k, value=v, partition=p, headers=h)
                       for k, v, p, h in self._records(partition, encoded, seq, self._partitions)]
            wait_acknowledged(producer, futures, self.config["delivery_timeout"])
        except Exception as exc:  # noqa: BLE001 - kafka-python raises many kinds; all become typed
            error = self._txn_error(exc, action, partition, slot)
            self._discard(partition)
            raise error from exc
        self._slot[partition] = slot
        self._pending[partition] = recorded(producer, self.transactional_id(partition, slot))
        seq += len(encoded)
        self._counts[partition] = seq
        return seq

    def close(self) -> None:
        """Close the transactional producers (an open transaction stays open: the checkpoint that
        names it decides, at the next open, whether it is committed)."""
        producers, self._producers = list(self._producers.values()), {}
        self._pending.clear()
        self._open.clear()
        for producer in producers:
            try:
                producer.close(timeout=1)
            except Exception:  # noqa: BLE001 - best effort
                log.debug("closing a transactional producer raised", exc_info=True)

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


def _commit_transaction(producer: Any, timeout: float) -> None:
    """``producer.commit_transaction()`` within ``timeout`` seconds (kafka-python 3.0 waits forever,
    e.g. retrying an EndTxn a broker answers by closing the connection)."""
    result = producer._transaction_manager.begin_commit()
    producer._sender.wakeup()
    if not result.wait(timeout_ms=int(timeout * 1000)):
        raise TimeoutError(f"the transaction commit was not confirmed within {timeout:g}s")


def copy_input_to_topic(job: JobConfig, name: str, settings: Mapping[str, Any], topic: str, *,
                        key_serde: str = "string", value_serde: str = "json", replication_factor: int = -1) -> int:
    """Copy every record of input ``name`` of ``job`` (a generator, file or JSON-lines input) into
    ``topic``, partition ``p`` to topic partition ``p``, creating the topic with the job's partition
    count when missing. For demos and tests: it fills the topics of a job's Kafka variant with the
    very records of its original inputs. Returns the number of records copied."""
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


class KafkaStreams(StreamSystem):
    """``kafka``: topics read by offset range (partition ``p`` to job partition ``p``), acknowledged outputs."""

    description = "Kafka topics (kafka-python)"
    input = KafkaInput
    output = KafkaOutput
