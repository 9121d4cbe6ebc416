"""PySpark Data Source ``localstate-kafka``: Kafka topics as DataFrames, read and written with
kafka-python through PySpark 4's Python Data Source API -- no JVM connector jar.

::

    from localstate.runtime.spark.kafka_source import register
    register(spark)
    views = (spark.read.format("localstate-kafka").option("bootstrap_servers", "broker:9092")
             .option("topic", "page-views").load())            # also spark.readStream
    (counts.selectExpr("user AS key", "CAST(n AS STRING) AS value").write.format("localstate-kafka")
     .option("bootstrap_servers", "broker:9092").option("topic", "counts").mode("append").save())

**Reading** (batch and streaming) gives ``key binary, value binary, topic string, partition int,
offset long, timestamp timestamp``. Spark input partition ``p`` reads topic partition ``p`` (every
topic partition is listed, in order, even with nothing to read), so per-partition processing
(``df.rdd.mapPartitionsWithIndex``) sees exactly one topic partition, as a job partition does.
Offsets: ``startingOffsets`` = ``earliest`` (default) | ``latest`` | JSON ``{"0": 42, "1": 0}``;
``endingOffsets`` (batch) = ``latest`` (default) | JSON. A streaming query keeps its offsets in its
own Spark checkpoint; nothing is committed to Kafka. ``max_records_per_trigger`` = N caps a
micro-batch at N records, shared among the partitions in proportion to their lag (Spark's Kafka
``maxOffsetsPerTrigger``; ``trigger(availableNow=True)`` then reads what is there in several
micro-batches). ``partitions`` = N makes a read fail unless
the topic has exactly N partitions.

**Writing** takes a ``value`` column and optional ``key`` and ``partition`` columns (binary or
string; ``partition`` int). Without ``partition``, a record goes to ``murmur2(key) % partitions``
-- Kafka's default partitioner, :func:`localstate.core.partitioner.partition_for` -- and a record
without a key to the Spark task's partition modulo the partition count. ``acks=all``; each task
waits for every acknowledgement before it reports success. Records of tasks that succeeded stay
in the topic when the write fails as a whole (at-least-once: Kafka has no rollback here).

Reading and writing use the very functions of the job streams (:mod:`.io`): :func:`end_offsets`,
:func:`read_records` and :class:`TopicWriter`. Connection options are those of ``[inputs.X]``
(``bootstrap_servers``, ``security_protocol``, ``sasl_*``, ``ssl_*`` with ``*_env`` secrets read on
the executors, ``connect_timeout``, ``request_timeout``).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from itertools import islice
from typing import Any, Iterator, Mapping, Sequence

import pyarrow as pa
import pyarrow.compute as pc
from kafka import TopicPartition
from pyspark import TaskContext
from pyspark.sql.datasource import (DataSource, DataSourceReader, DataSourceStreamReader, DataSourceStreamWriter,
                                    DataSourceWriter, InputPartition, WriterCommitMessage)
from pyspark.sql.types import StructType

from localstate.changelog.kafka.client import CONNECTION_OPTIONS, bootstrap_servers, client_settings, kafka_error
from localstate.core.options import Option, parse_duration, validate_options
from localstate.core.partitioner import partition_for
from localstate.errors import ConfigError, InputError, LocalStateError, OutputError

from localstate.changelog.kafka.io import TopicWriter, end_offsets, ensure_topic, pooled_consumer, read_records, release_consumer, \
    topic_partitions

try:  # PySpark >= 4.2: lets trigger(availableNow=True) stop at the offsets current when it started
    from pyspark.sql.streaming.datasource import (ReadAllAvailable, ReadLimit, ReadMaxRows,
                                                  SupportsTriggerAvailableNow)
except ImportError:  # pragma: no cover - older PySpark 4
    class SupportsTriggerAvailableNow:  # type: ignore[no-redef]
        pass

    ReadAllAvailable = ReadLimit = ReadMaxRows = None  # type: ignore[assignment,misc]

__all__ = ["KafkaDataSource", "KafkaRangePartition", "register", "SCHEMA", "NAME"]

log = logging.getLogger(__name__)

NAME = "localstate-kafka"
SCHEMA = "key binary, value binary, topic string, partition int, offset long, timestamp timestamp"

_OPTIONS: dict[str, Option] = {
    **CONNECTION_OPTIONS,
    "topic": Option(str, doc="the Kafka topic"),
    "partitions": Option(int, default=0, minimum=0,
                         doc="reads: expected partition count (0: any); writes: partitions of a created topic"),
    "startingoffsets": Option(str, default="earliest", doc="earliest | latest | JSON {\"<partition>\": offset}"),
    "endingoffsets": Option(str, default="latest", doc="batch reads: latest | JSON {\"<partition>\": offset}"),
    "probe_timeout": Option((int, float, str), default=2.0, parse=parse_duration, minimum=0.01,
                            doc="how long planning waits for a partition's end"),
    "max_records_per_trigger": Option(int, default=0, minimum=0,
                                      doc="streaming reads: at most this many records per micro-batch, shared "
                                          "among the partitions in proportion to what each has to read (0: no "
                                          "limit; as Spark's Kafka maxOffsetsPerTrigger; PySpark 4.2 or later)"),
    "create": Option(bool, default=False, doc="writes: create the topic when missing (with `partitions`)"),
    "replication_factor": Option(int, default=-1, minimum=-1, doc="writes: replication of a created topic"),
    "linger": Option((int, float, str), default=0.005, parse=parse_duration, doc="writes: producer linger"),
    "compression": Option(str, default=None, choices=(None, "gzip", "snappy", "lz4", "zstd"),
                          doc="writes: batch compression"),
    "delivery_timeout": Option((int, float, str), default=30.0, parse=parse_duration, minimum=0.1,
                               doc="writes: fail a task whose records are not acknowledged within this"),
}


def _typed(spec: Option, text: Any) -> Any:
    """Data Source options arrive as strings: turn them into what ``spec`` expects."""
    types = spec.type if isinstance(spec.type, tuple) else (spec.type,)
    if not isinstance(text, str):
        return text
    if bool in types and text.strip().lower() in ("true", "false"):
        return text.strip().lower() == "true"
    if int in types:
        try:
            return int(text)
        except ValueError:
            pass
    if float in types:
        try:
            return float(text)
        except ValueError:
            pass
    return text


@dataclass
class _Config:
    """Validated options; picklable (shipped to executors). Secrets stay as ``*_env`` names until
    a client is built, on the executor."""

    options: dict[str, Any]

    @classmethod
    def parse(cls, raw: Mapping[str, Any]) -> "_Config":
        values = {str(k).lower(): v for k, v in dict(raw).items() if str(k).lower() != "path"}
        values = {k: _typed(_OPTIONS[k], v) if k in _OPTIONS else v for k, v in values.items()}
        return cls(validate_options(_OPTIONS, values, NAME))

    @property
    def topic(self) -> str:
        return self.options["topic"]

    @property
    def servers(self) -> str:
        return bootstrap_servers(self.options)

    def settings(self) -> dict[str, Any]:
        return client_settings({k: self.options[k] for k in CONNECTION_OPTIONS}, path=NAME)

    def offsets(self, name: str) -> dict[int, int] | str:
        """``earliest`` / ``latest``, or the JSON object of option ``name`` as {partition: offset}."""
        text = self.options[name].strip()
        if text in ("earliest", "latest"):
            return text
        try:
            return {int(k): int(v) for k, v in json.loads(text).items()}
        except (ValueError, AttributeError, TypeError) as exc:
            raise ConfigError.at(f"{NAME}.{name}", f"expected earliest, latest or a JSON object "
                                                   f"{{\"<partition>\": offset}}, got {text!r}") from exc


@dataclass
class KafkaRangePartition(InputPartition):
    """Offsets ``[start, end)`` of one topic partition."""

    partition: int
    start: int
    end: int

    def __post_init__(self) -> None:
        self.value = self.partition


def _plan(config: _Config, starting: Mapping[int, int] | str | None, ending: Mapping[int, int] | str | None,
          known: Mapping[int, int] | None = None) -> tuple[dict[int, int], dict[int, int]]:
    """(start, end) offsets of every partition, checked against ``partitions``. Runs on the driver."""
    settings = config.settings()
    try:
        consumer = pooled_consumer(settings)
    except Exception as exc:  # noqa: BLE001
        raise kafka_error(exc, f"connect to plan a read of topic {config.topic!r}", config.servers,
                          error=InputError, topic=config.topic) from exc
    ok = False
    try:
        count = topic_partitions(consumer, config.topic)
        expected = config.options["partitions"]
        if count == 0:
            raise InputError(f"topic {config.topic!r} does not exist on {config.servers}", topic=config.topic,
                             bootstrap_servers=config.servers, hint="create it, or fix option topic")
        if expected and count != expected:
            raise InputError(f"topic {config.topic!r} has {count} partition(s), expected {expected}",
                             topic=config.topic, bootstrap_servers=config.servers,
                             hint="read a topic with the expected partition count, or change option partitions")
        tps = [TopicPartition(config.topic, p) for p in range(count)]
        earliest = {tp.partition: int(o or 0) for tp, o in consumer.beginning_offsets(tps).items()}
        latest = end_offsets(consumer, config.topic, range(count), known, timeout=config.options["probe_timeout"])
        ok = True
    except LocalStateError:
        ok = True
        raise
    except Exception as exc:  # noqa: BLE001
        raise kafka_error(exc, f"plan a read of topic {config.topic!r}", config.servers,
                          error=InputError, topic=config.topic) from exc
    finally:
        release_consumer(settings, consumer, ok)

    def pick(spec: Mapping[int, int] | str | None, default: dict[int, int]) -> dict[int, int]:
        if spec is None:
            return dict(default)
        if spec == "earliest":
            return dict(earliest)
        if spec == "latest":
            return dict(latest)
        unknown = sorted(p for p in spec if not 0 <= p < count)  # type: ignore[union-attr]
        if unknown:
            raise ConfigError.at(NAME, f"offsets given for partitions {unknown}, but topic {config.topic!r} has "
                                       f"{count} partition(s)")
        return {p: spec.get(p, default[p]) for p in range(count)}  # type: ignore[union-attr]

    return pick(starting, earliest), pick(ending, latest)


READ_BATCH_ROWS = 10_000
"""Records per Arrow batch a read hands Spark (Spark's own ``maxRecordsPerBatch`` default)."""


def _arrow_schema() -> Any:
    """:data:`SCHEMA` as the Arrow schema Spark expects of a Python data source's batches."""
    return pa.schema([("key", pa.binary()), ("value", pa.binary()), ("topic", pa.string()), ("partition", pa.int32()),
                      ("offset", pa.int64()), ("timestamp", pa.timestamp("us", tz="UTC"))])


def _read(config: _Config, split: KafkaRangePartition) -> Iterator[Any]:
    """The rows of one range (executor side) as Arrow record batches of :data:`SCHEMA`, at most
    :data:`READ_BATCH_ROWS` each: Spark takes them as they are, where it converts rows given as
    tuples one value at a time. A record's timestamp is null when Kafka has none (-1)."""
    topic, partition = config.topic, split.partition
    schema = _arrow_schema()
    records = read_records(config.settings(), topic, partition, split.start, split.end)
    while True:
        chunk = list(islice(records, READ_BATCH_ROWS))
        if not chunk:
            return
        n = len(chunk)
        millis = [-1 if r.timestamp is None else r.timestamp for r in chunk]
        stamps = pa.array(millis, pa.int64())
        absent = pc.less(stamps, 0)
        micros = pc.if_else(absent, pa.scalar(None, pa.int64()), pc.multiply(stamps, 1000))
        yield pa.RecordBatch.from_arrays([
            pa.array([r.key for r in chunk], pa.binary()), pa.array([r.value for r in chunk], pa.binary()),
            pa.array([topic] * n, pa.string()), pa.array([partition] * n, pa.int32()),
            pa.array([r.offset for r in chunk], pa.int64()), micros.cast(pa.timestamp("us", tz="UTC"))],
            schema=schema)


class _BatchReader(DataSourceReader):
    def __init__(self, config: _Config) -> None:
        self.config = config

    def partitions(self) -> Sequence[InputPartition]:
        start, end = _plan(self.config, self.config.offsets("startingoffsets"), self.config.offsets("endingoffsets"))
        return [KafkaRangePartition(p, start[p], max(start[p], end[p])) for p in sorted(start)]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        return _read(self.config, partition)  # type: ignore[arg-type]


class _StreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Offsets are ``{"<partition>": next offset}``; Spark keeps them in the query checkpoint."""

    def __init__(self, config: _Config) -> None:
        self.config = config
        self._target: dict[int, int] | None = None

    def initialOffset(self) -> dict:
        start, _ = _plan(self.config, self.config.offsets("startingoffsets"), None)
        return {str(p): o for p, o in start.items()}

    def latestOffset(self, start: dict | None = None, limit: Any = None) -> dict:
        # ``limit``: ReadMaxRows from option max_records_per_trigger (getDefaultReadLimit), or
        # ReadAllAvailable (the default, and what Spark passes when a trigger must read everything).
        known = {int(p): int(o) for p, o in (start or {}).items()}
        _, end = _plan(self.config, None, None, known)
        if self._target is not None:
            end = {p: min(o, self._target.get(p, o)) for p, o in end.items()}
        end = {p: max(o, known.get(p, 0)) for p, o in end.items()}
        if ReadMaxRows is not None and isinstance(limit, ReadMaxRows):
            end = _limited(known, end, limit.max_rows)
        return {str(p): o for p, o in end.items()}

    def getDefaultReadLimit(self) -> Any:  # noqa: N802 - Spark's name
        most = self.config.options["max_records_per_trigger"]
        if not most or ReadMaxRows is None:
            return ReadAllAvailable() if ReadAllAvailable is not None else None
        return ReadMaxRows(most)

    def prepareForTriggerAvailableNow(self) -> None:
        _, self._target = _plan(self.config, None, None)

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        # Every partition, in order, so Spark partition p is topic partition p.
        return [KafkaRangePartition(int(p), int(start.get(p, 0)), int(end[p]))
                for p in sorted(end, key=int)]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        return _read(self.config, partition)  # type: ignore[arg-type]

    def commit(self, end: dict) -> None:
        """Nothing to do: the positions live in Spark's checkpoint, never in Kafka."""


def _limited(start: Mapping[int, int], end: Mapping[int, int], most: int) -> dict[int, int]:
    """``end`` moved back so that at most ``most`` records lie between ``start`` and it, shared among
    the partitions in proportion to what each has to read (largest remainders first, ties to the lower
    partition: deterministic), at least one record in all while any is left."""
    lag = {p: max(0, o - start.get(p, 0)) for p, o in end.items()}
    total = sum(lag.values())
    if total <= most:
        return dict(end)
    most = max(1, most)
    share = {p: lag[p] * most // total for p in lag}
    left = most - sum(share.values())
    for p in sorted(lag, key=lambda p: (-(lag[p] * most % total), p))[:left]:
        share[p] += 1
    return {p: start.get(p, 0) + min(share[p], lag[p]) for p in end}


@dataclass
class KafkaWriteMessage(WriterCommitMessage):
    """What one task wrote: records per topic partition."""

    counts: dict[int, int] = field(default_factory=dict)


def _as_bytes(value: Any, column: str) -> bytes | None:
    if value is None or isinstance(value, bytes):
        return value
    if isinstance(value, bytearray):
        return bytes(value)
    if isinstance(value, str):
        return value.encode("utf-8")
    raise OutputError(f"column {column!r} must be binary or string, got {type(value).__name__}",
                      hint=f"cast it: CAST({column} AS STRING), or to_json(...) for structs")


class _Writer:
    """Shared by the batch and the streaming writer."""

    def __init__(self, config: _Config, schema: StructType) -> None:
        self.config = config
        names = set(schema.fieldNames())
        if "value" not in names:
            raise OutputError(f"writing to {NAME} needs a 'value' column (got {sorted(names)})",
                              topic=config.topic, hint="select the value as 'value' (and optionally 'key', "
                                                       "'partition')")
        extra = sorted(names - {"key", "value", "partition"})
        if extra:
            raise OutputError(f"writing to {NAME}: unexpected columns {extra}", topic=config.topic,
                              hint="keep only key, value and partition (e.g. to_json(struct(...)) AS value)")
        self.has_key, self.has_partition = "key" in names, "partition" in names

    def write(self, iterator: Iterator[Any]) -> KafkaWriteMessage:
        config = self.config
        settings = config.settings()
        options = config.options
        if options["create"] and not options["partitions"]:
            raise OutputError(f"create = true needs option partitions (the partition count of topic {config.topic!r})",
                              topic=config.topic, hint="set .option('partitions', N)")
        try:
            count = ensure_topic(settings, config.topic, options["partitions"], options["replication_factor"],
                                 options["create"])
        except LocalStateError:
            raise
        except Exception as exc:  # noqa: BLE001
            raise kafka_error(exc, f"check topic {config.topic!r}", config.servers, error=OutputError,
                              topic=config.topic) from exc
        if count == 0:
            raise OutputError(f"topic {config.topic!r} does not exist on {config.servers}", topic=config.topic,
                              hint="create it first, or set options create = true and partitions = N")
        writer = TopicWriter(settings, config.topic, linger=options["linger"], compression=options["compression"],
                             delivery_timeout=options["delivery_timeout"])
        count = writer.partitions()
        context = TaskContext.get()
        task_partition = context.partitionId() if context is not None else 0
        counts: dict[int, int] = {}
        for row in iterator:
            key = _as_bytes(row["key"], "key") if self.has_key else None
            value = _as_bytes(row["value"], "value")
            target = row["partition"] if self.has_partition and row["partition"] is not None else None
            if target is None:
                target = partition_for(key, count) if key is not None else task_partition % count
            elif not 0 <= target < count:
                raise OutputError(f"row partition {target} is not a partition of topic {config.topic!r} "
                                  f"({count} partitions)", topic=config.topic, partition=target)
            writer.send(key, value, target)
            counts[target] = counts.get(target, 0) + 1
        writer.flush()
        return KafkaWriteMessage(counts)


class _BatchWriter(DataSourceWriter):
    def __init__(self, config: _Config, schema: StructType) -> None:
        self.writer = _Writer(config, schema)

    def write(self, iterator: Iterator[Any]) -> WriterCommitMessage:
        return self.writer.write(iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        total = sum(sum(m.counts.values()) for m in messages if isinstance(m, KafkaWriteMessage))
        log.info("wrote %d record(s) to Kafka topic %s", total, self.writer.config.topic)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        total = sum(sum(m.counts.values()) for m in messages if isinstance(m, KafkaWriteMessage))
        log.warning("write to Kafka topic %s failed; %d record(s) of the tasks that succeeded stay in the topic "
                    "(Kafka writes cannot be rolled back)", self.writer.config.topic, total)


class _StreamWriter(DataSourceStreamWriter):
    def __init__(self, config: _Config, schema: StructType) -> None:
        self.writer = _Writer(config, schema)

    def write(self, iterator: Iterator[Any]) -> WriterCommitMessage:
        return self.writer.write(iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # noqa: N803 - Spark's name
        """Nothing to do: every task waited for its acknowledgements."""

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # noqa: N803
        log.warning("micro-batch %d to Kafka topic %s failed; records of the tasks that succeeded stay in the topic "
                    "and are written again when the batch is retried (at-least-once)", batchId,
                    self.writer.config.topic)


class KafkaDataSource(DataSource):
    """``format("localstate-kafka")``: see the module docstring for options and guarantees."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> str:
        return SCHEMA

    def _config(self) -> _Config:
        return _Config.parse(self.options)

    def reader(self, schema: StructType) -> DataSourceReader:
        return _BatchReader(self._config())

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:  # noqa: N802 - Spark's name
        return _StreamReader(self._config())

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        return _BatchWriter(self._config(), schema)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:  # noqa: N802
        return _StreamWriter(self._config(), schema)


def register(spark: Any) -> None:
    """Register ``localstate-kafka`` with a SparkSession (once per session)."""
    spark.dataSource.register(KafkaDataSource)
