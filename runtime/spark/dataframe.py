"""The DataFrame entry point: run a localstate task over a Spark DataFrame, one micro-batch at a time,
exactly once under Spark's retries and restarts.

    out = run_batch(df, job, key="user", batch_id=7, order_by="ts")   # a DataFrame of the task's outputs
    query = events.writeStream.foreachBatch(foreach_batch(job, key="user", sink=write)).start()

One batch (:func:`run_batch`, on the driver):

1. The DataFrame's schema is checked (:func:`dataframe_spec`): the key column exists and is a string,
   integer or binary column; every column converts to Arrow (SchemaError naming the column otherwise).
2. Each row gets its job partition (:func:`~localstate.core.partitioner.partition_for` of the key,
   Kafka-compatible, like every localstate input) in the JVM (:func:`partition_column`: Kafka's murmur2
   of a string or integer key through commons-codec, which Spark ships; an Arrow UDF for binary keys),
   and ``monotonically_increasing_id()`` its sequence number, assigned *before* the
   shuffle (input partition and row index), so the order is the same each time Spark executes the
   batch again. ``repartition`` on a route value chosen per partition (:func:`routes`) puts job
   partition ``p`` into Spark partition ``p``. With ``partitioned`` (input already partitioned by
   key, e.g. a Kafka topic read through ``localstate-kafka``) there is none of this: the rows stay
   where they are and step 3 checks each row's partition.
3. ``mapInArrow`` sorts each job partition's rows by ``(order_by, sequence)``, checks Spark's
   ``streaming.sql.batchId`` against the batch id, checks the partition's instance out of its Python
   worker (:func:`~.instances.checkout`: the one kept open since the partition's last batch if the
   committed checkpoint is exactly what that batch prepared, else one opened and recovered to the
   checkpoint) and feeds the rows through the runtime's one feed loop (:meth:`TaskInstance.feed`),
   then prepares the commit (changelogs and local state flushed, the batch's outputs, if any, written
   to ``<state_dir>/<job>/dataframe-outputs/<p>/<batch>.parquet``). The checkpoint, which records the
   batch id (:attr:`Checkpoint.batch`) and the outputs' row count, goes back to the driver; with
   ``keep_open`` the worker keeps the instance open for the partition's next batch.
4. When every task succeeded, the driver saves the checkpoints; the result is a DataFrame read from
   the batch's output files (:data:`OUTPUT_SCHEMA`).

Steps 2 and 3 are one Spark job (adaptive query execution off for it: :func:`_job_settings`) whose
apply stage is made once per DataFrame shape (:class:`_ApplyStage`); the batch's own fields reach its
tasks as JSON in a local property (:data:`BATCH_PROPERTY`).

Why exactly once. The batch id is committed in each partition's checkpoint, atomically with its state
(the same file names the changelog offsets). A partition whose checkpoint already holds batch ``B``
does not apply ``B`` again when Spark re-executes it (a retried task, a driver restarted from the
query's checkpointLocation, a failed sink write): its outputs are served from the file the committed
attempt wrote, so the re-run returns the same rows. A partition whose commit was lost (the driver
died between saving two partitions' checkpoints) is rolled back to its checkpoint at open and applies
the batch again: local state and changelog are trimmed to the checkpoint, as in every localstate
restart. Each partition keeps the outputs of its last applied batch only: Spark re-executes only the
last batch of a query (it starts batch ``B + 1`` only after ``B``'s foreachBatch returned), so an
older id means the query's checkpoint was reset or belongs to another query: BatchOrderError.
"""

from __future__ import annotations

import io
import json
import logging
import os
import re
import pickle
import shutil
import time
import uuid
import weakref
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timezone
from itertools import count, repeat
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping, cast

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyspark import TaskContext
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.pandas.functions import pandas_udf
from pyspark.sql.pandas.types import to_arrow_type
from pyspark.sql.types import DateType, IntegerType, NumericType, TimestampNTZType, TimestampType
from pyspark.util import PythonEvalType

from localstate.core.checkpoint import Checkpoint
from localstate.core.config import JobConfig, load_job_config
from localstate.core.fsutil import ensure_dir, os_error, write_atomic
from localstate.core.names import safe_join
from localstate.core.partitioner import partition_for, partitions_of
from localstate.runtime.layout import (checkpoint_store, create_changelog_streams, epoch_parts, job_directory,
                                       resolve_epoch)
from localstate.runtime.spark.failures import executor_failure, spark_failure
from localstate.runtime.spark.affinity.exchange import RowExchange
from localstate.runtime.partition.sink import NoTransactions, commit_recorded
from localstate.runtime.partition.lifecycle import PartitionTask, fault_for
from localstate.runtime.partition.records import ArrowRows
from localstate.runtime.spark.affinity.kept import Lease, checkin, checkout, kept_partition, release_partitions
from localstate.runtime.spark.config import SparkConfig
from localstate.core.options import validate_options
from localstate.core.stream import NO_BOUNDS, BadTimestamp, InputRecord, TimestampRule, timestamp_rule
from localstate.core.event_time import TIMESTAMP_OPTIONS
from localstate.core.task import BatchTask, OutgoingMessage, add_task_paths, load_task_class, merge_counts
from localstate.errors import (BatchOrderError, CheckpointIOError, InputError, LocalStateError, OutputIOError,
                               SchemaError)

__all__ = ["run_batch", "foreach_batch", "release", "BATCH_ID_PROPERTY", "batch_outputs", "dataframe_spec", "DataFrameSpec", "DataFrameBatch",
           "BatchOutputs", "OUTPUT_SCHEMA", "TASK_PHASES", "routes", "ARROW_BATCH_ROWS", "partition_column",
           "MURMUR2_CLASS", "routed", "jvm_has_murmur2", "BATCH_PROPERTY", "APPLY_WORKERS_ENV"]

log = logging.getLogger(__name__)

OUTPUT_SCHEMA = "partition INT, batch_id BIGINT, seq BIGINT, stream STRING, key STRING, value STRING"
"""The rows :func:`run_batch` returns, one per message the task sent: the job partition that sent it,
the batch, its position among the partition's messages of the batch, the output stream, and key and
value as JSON text (bytes as hex, other non-JSON values as ``str()``)."""

OUTPUT_ROWS = "dataframe-outputs"
"""The key of a partition's checkpoint ``outputs`` that holds how many rows its batch's outputs file has."""

ARROW_BATCH_ROWS = 100_000
"""Rows per Arrow batch between the JVM and Python in localstate's own Spark job (the routing UDF,
mapInArrow), unless the session sets ``spark.sql.execution.arrow.maxRecordsPerBatch`` itself: Spark's
default (10,000) hands a 100k-row micro-batch over in ten round trips per stage, this in one."""
_ARROW_BATCH_CONF = "spark.sql.execution.arrow.maxRecordsPerBatch"
_AQE_CONF = "spark.sql.adaptive.enabled"

_PARTITION, _SEQ = "__localstate_partition", "__localstate_seq"
_COLUMN = "__localstate_c"
"""Prefix of the positional names the input columns travel under to the apply stage: Spark's
``mapInArrow`` resolves its input by name, and fails on names such as ``user.id`` (read as a struct
field) or names with a backtick; the apply task renames them back (:func:`_original_names`)."""
_RESULT_SCHEMA = "partition INT, applied BOOLEAN, checkpoint STRING, records BIGINT, outputs BIGINT, " \
                 "reused BOOLEAN, query_batch BIGINT, pid BIGINT, started DOUBLE, " \
                 "input DOUBLE, open DOUBLE, convert DOUBLE, process DOUBLE, commit DOUBLE, error BINARY, " \
                 "counts STRING"
#: Phases of one job partition's task, in seconds (:attr:`DataFrameBatch.task_seconds`): receiving
#: its rows from the shuffle as Arrow batches and sorting them (counted for the first job partition of
#: a Spark task; with :func:`routes` a Spark task holds one), opening and recovering the partition,
#: converting its Arrow rows into records, the task's ``process()`` (the one feed loop, store reads
#: and writes included), preparing the commit (store flush, changelog fsync, the outputs file) and
#: closing.
TASK_PHASES = ("input", "open", "convert", "process", "commit")


@dataclass
class DataFrameBatch:
    """What :func:`run_batch` did, for progress reports and benchmarks."""

    batch_id: int
    records: int = 0
    """input rows applied (0 for partitions that had applied the batch before)"""
    outputs: int = 0
    applied: list[int] = field(default_factory=list)
    """the job partitions that applied the batch in this call"""
    replayed: list[int] = field(default_factory=list)
    """the job partitions that had applied it before: their outputs were served from the kept file"""
    seconds: float = 0.0
    """wall time of the Spark job and the checkpoint saves"""
    task_seconds: dict[str, float] = field(default_factory=dict)
    """:data:`TASK_PHASES` summed over the partitions"""
    busiest_task: float = 0.0
    reused: list[int] = field(default_factory=list)
    """the job partitions whose instance was still open in their Python worker (not reopened)"""
    query_batch: int | None = None
    """the micro-batch id Spark set on the tasks (``streaming.sql.batchId``; checked against
    ``batch_id``); None outside a streaming query"""
    workers: dict[int, int] = field(default_factory=dict)
    """the process id of the Python worker that ran each job partition"""
    plan_seconds: float = 0.0
    """Spark planning the batch's job (analysis, optimization, physical plan), part of :attr:`seconds`"""
    first_task_seconds: float = 0.0
    """from the Spark job's start to the first apply task's start: the first stage (reading the
    input, routing each row to its partition, the shuffle write) and scheduling"""
    counts: dict[str, dict[str, int]] = field(default_factory=dict)
    """what the applied partitions dropped or redirected (``late_records`` per window store), summed"""
_KEY_TYPES = ("StringType", "ByteType", "ShortType", "IntegerType", "LongType", "BinaryType")


@dataclass(frozen=True)
class DataFrameSpec:
    """What the executors need to turn a DataFrame's rows into the task's input records."""

    job: JobConfig
    key: str
    """the key column: partitions the rows and is the records' key"""
    stream: str = "dataframe"
    """the input stream name the task sees (``envelope.stream``) and the checkpoint's input position"""
    order_by: str | None = None
    """rows of a partition are fed by ``(order_by, sequence)``; None: by sequence (the input order)"""
    value: str | None = None
    """the column that is the records' value; None: the whole row as a dict of the input columns"""
    columns: tuple[str, ...] = ()
    """the input columns"""
    ts: str | None = None
    """``number`` / ``timestamp``: the order column is also the records' timestamp (seconds)"""
    key_type: str = "StringType"
    """the Spark type of the key column (its class name, one of ``_KEY_TYPES``)"""
    timestamps: TimestampRule = NO_BOUNDS
    """how the order column becomes event time (``timestamp_unit`` divides a numeric one; the bounds
    apply to every kind): a row whose timestamp it refuses is a bad record, which fails the batch"""


def _column_list(schema: Any) -> str:
    return ", ".join(f"{field.name} {field.dataType.simpleString()}" for field in schema.fields)


def dataframe_spec(df: Any, job: JobConfig, *, key: str, order_by: str | None = None, value: str | None = None,
                   stream: str = "dataframe", timestamp_unit: str = "s", min_timestamp: Any = False,
                   max_timestamp: Any = False) -> DataFrameSpec:
    """Check ``df``'s schema against what the task gets (SchemaError naming the column and listing
    the DataFrame's columns otherwise). ``timestamp_unit``, ``min_timestamp`` and ``max_timestamp`` are
    an input's options of the same names (:data:`~localstate.core.event_time.TIMESTAMP_OPTIONS`;
    by default no bounds: the order column may be any ordering number); a bad one is a ConfigError at
    ``<stream>.<option>``."""
    schema = df.schema
    names = [field.name for field in schema.fields]
    for name in names:
        if names.count(name) > 1:  # e.g. after a join: the rows' dicts and Spark's resolution would be ambiguous
            raise SchemaError(f"column {name!r} appears {names.count(name)} times in the DataFrame", column=name,
                              hint="rename or drop the duplicates (e.g. alias each side of the join) first")
    fields = {column.name: column for column in schema.fields}
    for role, name in (("key", key), ("order_by", order_by), ("value", value)):
        if name is not None and name not in fields:
            raise SchemaError(f"{role} column {name!r} is not in the DataFrame", column=name,
                              hint=f"name one of its columns: {_column_list(schema)}")
    for name, column in fields.items():
        if name.startswith("__localstate_"):
            raise SchemaError(f"column {name!r} uses the prefix localstate reserves for its own columns",
                              column=name, hint="rename the column")
        try:
            to_arrow_type(column.dataType, timezone="UTC")  # any zone: only whether a conversion exists matters
        except Exception as exc:  # pyspark raises PySparkTypeError / TypeError for unsupported types
            raise SchemaError(f"column {name!r} of type {column.dataType.simpleString()} cannot be converted "
                              f"into the records the task gets ({exc})", column=name,
                              hint="cast or drop the column before handing the DataFrame to localstate") from None
    key_type = type(fields[key].dataType).__name__
    if key_type not in _KEY_TYPES:
        raise SchemaError(f"key column {key!r} has type {fields[key].dataType.simpleString()}; a key must be a "
                          "string, integer or binary column (it is partitioned like a Kafka key)", column=key,
                          hint=f"cast it, e.g. df.withColumn({key!r}, col({key!r}).cast('string'))")
    ts = None
    if order_by is not None:
        order_type = fields[order_by].dataType
        if isinstance(order_type, NumericType):
            ts = "number"
        elif isinstance(order_type, (TimestampType, TimestampNTZType, DateType)):
            ts = "timestamp"
    rule = timestamp_rule(stream, validate_options(TIMESTAMP_OPTIONS, {
        "timestamp_unit": timestamp_unit, "min_timestamp": min_timestamp, "max_timestamp": max_timestamp}, stream))
    return DataFrameSpec(job, key, stream, order_by, value, tuple(fields), ts, key_type, rule)


def _spark_hash_long(value: int, seed: int = 42) -> int:
    """Spark's ``hash()`` of a bigint (Murmur3_x86_32.hashLong, seed 42), as a signed 32-bit int."""
    mask = 0xFFFFFFFF

    def mix(h1: int, k1: int) -> int:
        k1 = (k1 * 0xCC9E2D51) & mask
        k1 = ((k1 << 15) | (k1 >> 17)) & mask
        k1 = (k1 * 0x1B873593) & mask
        h1 ^= k1
        h1 = ((h1 << 13) | (h1 >> 19)) & mask
        return (h1 * 5 + 0xE6546B64) & mask

    h1 = mix(mix(seed & mask, value & mask), (value >> 32) & mask) ^ 8
    h1 ^= h1 >> 16
    h1 = (h1 * 0x85EBCA6B) & mask
    h1 ^= h1 >> 13
    h1 = (h1 * 0xC2B2AE35) & mask
    h1 ^= h1 >> 16
    return h1 - (1 << 32) if h1 & 0x80000000 else h1


def routes(partitions: int) -> list[int]:
    """For each job partition ``p``, the smallest value that Spark's hash partitioning into
    ``partitions`` (``pmod(hash(value), partitions)``, what ``repartition(n, column)`` does) sends
    to Spark partition ``p``: rows carrying it land in the task of their own job partition."""
    found: dict[int, int] = {}
    value = 0
    while len(found) < partitions:
        found.setdefault(_spark_hash_long(value) % partitions, value)  # Python's % is pmod
        value += 1
    return [found[p] for p in range(partitions)]


class BatchOutputs(NoTransactions):
    """The output sink of a DataFrame batch: the messages a partition sent in batch ``batch``, as one
    Parquet file ``<state_dir>/<job>/dataframe-outputs/<partition>/<batch>.parquet`` written
    atomically (durable before the checkpoint names the batch). Only the last applied batch's file is
    kept (:meth:`keep_only`): it is what a re-executed batch is answered with."""

    def __init__(self, job: JobConfig, partition: int) -> None:
        self.job = job
        self.partition = partition
        self.batch: int | None = None
        self.written = 0

    def begin(self, batch: int, committed: int | None) -> None:
        """The messages written from now on are batch ``batch``'s; ``committed`` is the partition's
        committed batch (its file is kept, every other one deleted: :meth:`keep_only`)."""
        self.batch = batch
        self.keep_only(committed)

    @staticmethod
    def directory(job: JobConfig, partition: int) -> Path:
        job_directory(job)
        return safe_join(job.state_dir, job.name, *epoch_parts(job.epoch), "dataframe-outputs", str(partition))

    @classmethod
    def path(cls, job: JobConfig, partition: int, batch: int) -> Path:
        return safe_join(cls.directory(job, partition), f"{int(batch)}.parquet")

    def write(self, partition: int, messages: list[OutgoingMessage]) -> dict[str, int]:
        """Write the batch's messages; returns ``{OUTPUT_ROWS: n}``, which the checkpoint records (a
        batch without messages writes no file: its checkpoint says there is none to read)."""
        if self.batch is None:
            raise OutputIOError("DataFrame outputs written before the batch began", partition=partition)
        n = len(messages)
        if not n:
            return {OUTPUT_ROWS: 0}
        encode = _encoder()
        table = pa.table({
            "partition": pa.array([partition] * n, pa.int32()),
            "batch_id": pa.array([self.batch] * n, pa.int64()),
            "seq": pa.array(range(n), pa.int64()),
            "stream": pa.array([m.stream for m in messages], pa.string()),
            "key": pa.array([encode(m.key) for m in messages], pa.string()),
            "value": pa.array([encode(m.value) for m in messages], pa.string()),
        })
        buffer = io.BytesIO()
        pq.write_table(table, buffer)
        path = self.path(self.job, partition, self.batch)
        try:
            ensure_dir(self.job.state_dir, path.parent)
        except OSError as exc:
            raise os_error(exc, "create the DataFrame outputs directory", path.parent, OutputIOError,
                           partition=partition) from exc
        write_atomic(path, buffer.getvalue(), error=OutputIOError)
        self.written += n
        return {OUTPUT_ROWS: n}

    def rollback(self, partition: int, positions: Mapping[str, int]) -> None:
        """Nothing to do at open: :meth:`keep_only` drops what the checkpoint does not name."""

    def close(self) -> None:
        """Nothing to close: each batch's file is written whole by :meth:`write`."""

    def keep_only(self, batch: int | None) -> None:
        """Delete this partition's output files except the one of ``batch`` (the committed batch):
        files of attempts that never committed, and of batches before it."""
        directory = self.directory(self.job, self.partition)
        if not directory.is_dir():
            return
        keep = f"{batch}.parquet" if batch is not None else None
        for entry in os.listdir(directory):
            if entry.endswith(".parquet") and entry != keep and entry[:-8].isdigit():
                path = safe_join(directory, entry)
                try:
                    path.unlink()
                except OSError as exc:
                    raise os_error(exc, "delete an old DataFrame output file", path, OutputIOError,
                                   partition=self.partition) from exc


def _encoder() -> Callable[[Any], str]:
    def fallback(value: Any) -> Any:
        if isinstance(value, (bytes, bytearray, memoryview)):
            return bytes(value).hex()
        if hasattr(value, "isoformat"):
            return value.isoformat()
        return str(value)

    return json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), default=fallback).encode


# -- executors ----------------------------------------------------------------------------------------
BATCH_ID_PROPERTY = "streaming.sql.batchId"
"""The local property Spark sets on the tasks of a streaming query's micro-batch (also on the jobs
its foreachBatch function runs): the executors check it against the batch id the driver passed."""


def _partitions_of(keys: Any, partitions: int, column: str) -> Any:
    """The job partition of each key of the Arrow array ``keys``: computed once per distinct key of
    the batch, by :func:`~localstate.core.partitioner.partitions_of`."""
    if keys.null_count:
        raise SchemaError(f"key column {column!r} holds a null key", column=column,
                          hint="filter out rows without a key, or fill them in")
    return partitions_of(keys, partitions)


MURMUR2_CLASS = "org.apache.commons.codec.digest.MurmurHash2"
"""A Java class on Spark's classpath (commons-codec, a Spark dependency) whose static
``hash32(String)`` is Kafka's murmur2 (seed 0x9747b28c) of the string's UTF-8 bytes."""
_JVM_KEY_TYPES = ("StringType", "ByteType", "ShortType", "IntegerType", "LongType")


def partition_column(spec: DataFrameSpec, jvm: bool = True) -> Any:
    """The column expression giving each row its job partition, equal to
    :func:`~localstate.core.partitioner.partition_for` of its key. String and integer keys are hashed
    in the JVM (``reflect`` of :data:`MURMUR2_CLASS` on the key, integers as their decimal text, as
    :func:`~localstate.core.partitioner.key_bytes` does): the first stage of the batch's job then runs
    no Python at all. Binary keys, which ``reflect``
    cannot pass, go through an Arrow UDF, as every key does with ``jvm=False`` (a Spark without the
    class, :func:`jvm_has_murmur2`). A null key is refused with SchemaError naming the column (by the
    UDF, or by the apply task when the JVM gave it a null partition)."""
    sql = _partition_sql(spec, jvm)
    if sql is None:
        return _partition_udf(spec)(F.col(_sql_name(spec.key)))
    return F.expr(sql)


def _partition_sql(spec: DataFrameSpec, jvm: bool) -> str | None:
    """:func:`partition_column` as SQL text when it is hashed in the JVM; None when it is the Arrow UDF."""
    if not jvm or spec.key_type not in _JVM_KEY_TYPES:
        return None
    key = _sql_name(spec.key)
    # One SQL text, parsed in the JVM: one Py4J call per batch instead of one per expression node.
    return (f"CASE WHEN {key} IS NULL THEN CAST(NULL AS INT) ELSE CAST(pmod(CAST(reflect('{MURMUR2_CLASS}', "
            f"'hash32', CAST({key} AS STRING)) AS INT) & 2147483647, {int(spec.job.partitions)}) AS INT) END")


def jvm_has_murmur2(spark: Any) -> bool:
    """Whether the session's JVM has :data:`MURMUR2_CLASS` (commons-codec 1.13 or later, which Spark
    3 and 4 ship); without it :func:`routed` routes every key through the Arrow UDF. Looked up once
    per SparkContext (:func:`_per_context`): a JVM's classpath does not lose a class."""
    def lookup() -> bool:
        try:
            spark.sparkContext._jvm.java.lang.Class.forName(MURMUR2_CLASS)
        except Exception:  # noqa: BLE001 - Py4JJavaError (ClassNotFoundException), or no JVM gateway
            return False
        return True

    return cast(bool, _per_context(spark.sparkContext, "murmur2", lookup))


_CONTEXT_FACTS: "weakref.WeakKeyDictionary[Any, dict[str, Any]]" = weakref.WeakKeyDictionary()


def _context_facts(context: Any) -> dict[str, Any]:
    """What localstate keeps about a SparkContext, dropped with it."""
    return _CONTEXT_FACTS.setdefault(context, {})


def _per_context(context: Any, name: str, compute: Callable[[], Any]) -> Any:
    """``compute()``, once per SparkContext (Python's object, which every session of the context and
    every foreachBatch session shares): for facts that hold for the context's life, asked for every
    micro-batch at the cost of Py4J round trips otherwise. A new context (after ``stop()``) asks again."""
    facts = _context_facts(context)
    if name not in facts:
        facts[name] = compute()
    return facts[name]


def _sql_name(column: str) -> str:
    """``column`` quoted as a SQL identifier."""
    return "`" + column.replace("`", "``") + "`"


def _partition_udf(spec: DataFrameSpec) -> Any:
    """An Arrow UDF of the key column: each row's job partition. Only the key column travels to
    Python and back (the other columns stay in the JVM until the task that applies them)."""
    from pyspark.sql.functions import arrow_udf  # why: PySpark >= 4.1 only; JVM routing needs no UDF

    partitions, column = spec.job.partitions, spec.key

    def partition_of(keys: pa.Array) -> pa.Array:
        return _partitions_of(keys, partitions, column)

    partition_of.__annotations__ = {"keys": pa.Array, "return": pa.Array}  # the hints arrow_udf reads
    return arrow_udf(partition_of, IntegerType())


@dataclass(frozen=True)
class _BatchTask:
    """What every task of one batch's apply stage gets from the driver: the DataFrame's spec and
    whether its input is partitioned by key already (the same for every batch of a query: shipped
    with the apply function, :class:`_ApplyStage`), and the batch's own fields (shipped as JSON in
    the local property :data:`BATCH_PROPERTY`, :meth:`property_value`)."""

    spec: DataFrameSpec
    batch: int
    run_id: str
    """the Spark application: an instance kept open by one driver is never reused by another"""
    keep_open: bool
    tune_worker: bool
    """settle the Python workers (``[spark] worker_affinity`` as set: the worker tuning)"""
    fault: Mapping[str, Any] | None = None
    exchange: str | None = None
    """the batch's row exchange directory (:mod:`.exchange`; with ``keep_open``), None: no exchange"""
    partitioned: bool = False
    """the DataFrame's Spark partition p holds job partition p's rows only: no shuffle (checked per row)"""

    def property_value(self) -> str:
        """The batch's own fields as the value of :data:`BATCH_PROPERTY`: a JSON object of plain
        values (nothing an executor unpickles)."""
        return json.dumps({"batch": self.batch, "run_id": self.run_id, "keep_open": self.keep_open,
                           "tune_worker": self.tune_worker, "fault": None if self.fault is None else dict(self.fault),
                           "exchange": self.exchange}, separators=(",", ":"))

    @classmethod
    def on_executor(cls, spec: DataFrameSpec, partitioned: bool) -> "_BatchTask":
        """The batch this task runs: ``spec``, ``partitioned`` and the fields the driver set in
        :data:`BATCH_PROPERTY` (BatchOrderError when there is none, or it is not what
        :meth:`property_value` writes)."""
        context = TaskContext.get()
        value = context.getLocalProperty(BATCH_PROPERTY) if context is not None else None
        hint = "apply a DataFrame through localstate.spark.run_batch or foreach_batch"
        if value is None:
            raise BatchOrderError(f"the apply task found no {BATCH_PROPERTY} property: it was not started by "
                                  "localstate's run_batch", hint=hint)
        try:
            fields = json.loads(value)
            task = cls(spec, fields["batch"], fields["run_id"], fields["keep_open"], fields["tune_worker"],
                       fields["fault"], fields["exchange"], partitioned)
        except (ValueError, TypeError, KeyError):
            task = None
        if task is None or type(task.batch) is not int or not isinstance(task.run_id, str) \
                or not isinstance(task.exchange, (str, type(None))) or not isinstance(task.fault, (dict, type(None))):
            raise BatchOrderError(f"the apply task cannot read its {BATCH_PROPERTY} property: {value[:200]!r}",
                                  hint=hint)
        return task


BATCH_PROPERTY = "localstate.dataframe.batch"
"""The Spark local property carrying a batch's own fields (:class:`_BatchTask`, as JSON) to its apply
tasks: one Py4J call per batch, where shipping them with the apply function would build a new
Python UDF, and its JVM objects, for every micro-batch."""


def _apply(spec: DataFrameSpec, partitioned: bool) -> Callable[[Iterator[Any]], Iterator[Any]]:
    """mapInArrow's function: feed each job partition found in this Spark partition (after the
    shuffle, or as the input is with ``partitioned``) the rows of the batch named by
    :data:`BATCH_PROPERTY`. The same for every batch of a DataFrame shape (``spec``)."""

    def apply(batches: Iterator[Any]) -> Iterator[Any]:
        started_at, started = time.time(), time.perf_counter()
        task = _BatchTask.on_executor(spec, partitioned)
        slot = TaskContext.get().partitionId()
        exchange, kept, offer = None, None, False
        if task.exchange is not None:  # announced before the rows arrive: the partner task reads it meanwhile
            exchange = RowExchange(Path(task.exchange), slot)
            kept = kept_partition(spec.job, task.run_id)
            offer = exchange.announce(slot, kept)
        collected = list(batches)
        if not collected:
            if exchange is not None and offer:
                exchange.withdraw()  # no rows after all: nobody waits for them
            return
        table = _original_names(pa.Table.from_batches(collected), spec)
        if table.column(spec.key).null_count:  # before anything is applied: no partition gets the batch
            raise SchemaError(f"key column {spec.key!r} holds a null key", column=spec.key,
                              hint="filter out rows without a key, or fill them in")
        if partitioned:
            misplaced = _misplaced(table, spec, slot)
            if misplaced is not None:
                if exchange is not None and offer:
                    exchange.withdraw()
                yield _error_row(misplaced, task.batch, slot, started_at)
                return
            own = {slot: _in_order(table, spec)}
        else:
            own = _split(table, spec)
        assigned = exchange.assignments(own, kept, offer) if exchange is not None else own.items()
        received = time.perf_counter() - started
        for partition, rows in assigned:
            result = _run_partition(task, partition, rows)
            result.update(started=started_at, input=received)
            received = 0.0  # the next job partition's rows arrived with this one's
            yield pa.RecordBatch.from_pylist([result], schema=_result_schema())

    return apply


def _in_order(table: Any, spec: DataFrameSpec) -> Any:
    """One job partition's rows in feeding order: by ``order_by`` (a stable sort: ties keep their
    order), then by sequence number where the rows came through the shuffle (whose order a retry
    may change); rows read as they are (``partitioned``) are in their input order already."""
    keys = ([(spec.order_by, "ascending")] if spec.order_by else []) + \
        ([(_SEQ, "ascending")] if _SEQ in table.column_names else [])
    return table.sort_by(keys) if keys else table


def _split(table: Any, spec: DataFrameSpec) -> dict[int, Any]:
    """The rows of a shuffled Spark partition by job partition (:func:`routes` puts one in each),
    each in feeding order (:func:`_in_order`)."""

    parts = table.column(_PARTITION)
    low, high = pc.min_max(parts).values()
    if low == high:
        return {int(low.as_py()): _in_order(table, spec)}
    table = table.sort_by([(_PARTITION, "ascending")])
    column = table.column(_PARTITION).to_numpy()
    starts = np.flatnonzero(np.r_[True, column[1:] != column[:-1]])
    ends = np.r_[starts[1:], len(column)]
    return {int(column[start]): _in_order(table.slice(start, end - start), spec)
            for start, end in zip(starts.tolist(), ends.tolist())}


def _misplaced(table: Any, spec: DataFrameSpec, slot: int) -> LocalStateError | None:
    """With ``partitioned``: the InputError for rows of Spark partition ``slot`` whose key belongs to
    another job partition (or a Spark partition beyond the job's partitions), else None."""

    partitions = spec.job.partitions
    hint = ("pass partitioned=False (the rows are then shuffled by key), or read a source whose Spark partition p "
            "holds job partition p's keys only, e.g. a Kafka topic with the job's partition count written with "
            "Kafka's default (murmur2) partitioner through localstate-kafka")
    if slot >= partitions:
        return InputError(f"partitioned=True, but the DataFrame has a Spark partition {slot} and the job "
                          f"{partitions} partitions", partition=slot, hint=hint)
    owners = _partitions_of(table.column(spec.key).combine_chunks(), partitions, spec.key)
    wrong = pc.not_equal(owners, slot)
    if pc.any(wrong).as_py():
        key = table.column(spec.key).filter(wrong)[0].as_py()
        return InputError(f"partitioned=True, but Spark partition {slot} holds key {key!r:.80} of job partition "
                          f"{partition_for(key, partitions)}", partition=slot, column=spec.key, hint=hint)
    return None


def _error_row(error: BaseException, batch: int, partition: int, started: float) -> Any:
    """The apply stage's result row reporting ``error`` (raised on the driver)."""

    result: dict[str, Any] = {"partition": partition, "applied": False, "checkpoint": None, "records": 0,
                              "outputs": 0, "reused": False, "query_batch": None, "pid": os.getpid(),
                              "started": started, "error": executor_failure(error, batch, partition),
                              "counts": "{}", **dict.fromkeys(TASK_PHASES, 0.0)}
    return pa.RecordBatch.from_pylist([result], schema=_result_schema())


def _original_names(table: Any, spec: DataFrameSpec) -> Any:
    """``table`` (the apply stage's input) with the input columns under their own names again."""
    names = {f"{_COLUMN}{index}": name for index, name in enumerate(spec.columns)}
    return table.rename_columns([names.get(name, name) for name in table.column_names])


def _result_schema() -> Any:
    return pa.schema([("partition", pa.int32()), ("applied", pa.bool_()), ("checkpoint", pa.string()),
                      ("records", pa.int64()), ("outputs", pa.int64()), ("reused", pa.bool_()),
                      ("query_batch", pa.int64()), ("pid", pa.int64()), ("started", pa.float64()),
                      *((phase, pa.float64()) for phase in TASK_PHASES), ("error", pa.binary()),
                      ("counts", pa.string())])


_UTC_NAMES = frozenset({"UTC", "Etc/UTC", "+00:00", "Z"})
"""Time zone names of Arrow timestamps that are UTC itself: a UTC datetime is already in the zone."""
_PY_MICROS = (-62_135_596_800_000_000, 253_402_300_799_999_999)
"""The microseconds since the epoch that ``datetime.datetime`` can hold (years 1 to 9999)."""
_PY_DAYS = (-719_162, 2_932_896)
"""The days since the epoch that ``datetime.date`` can hold."""


def _pylist(column: Any) -> list[Any]:
    """``column.to_pylist()``, the same objects, for the columns a Spark DataFrame hands Python:
    microsecond timestamps and dates go through numpy (``datetime64`` to ``object``), where pyarrow
    builds each value through a scalar of its own (tz-aware timestamps some ten times slower than
    the rest of a row's conversion); an aware value is then made as pyarrow makes it (UTC, then
    ``astimezone`` of the column's zone as pyarrow reads it). Columns with nulls, other types and
    values outside what ``datetime`` holds go through ``to_pylist``."""
    kind = column.type
    timestamp = pa.types.is_timestamp(kind) and kind.unit == "us"
    if not (timestamp or pa.types.is_date32(kind)) or column.null_count or not len(column):
        return column.to_pylist()
    raw = pc.cast(column, pa.int64() if timestamp else pa.int32())
    low, high = (value.as_py() for value in pc.min_max(raw).values())
    lowest, highest = _PY_MICROS if timestamp else _PY_DAYS
    if low < lowest or high > highest:
        return column.to_pylist()  # what pyarrow does with them (an error) is kept
    values = raw.to_numpy().astype("datetime64[us]" if timestamp else "datetime64[D]").astype(object).tolist()
    zone_name = kind.tz if timestamp else None
    if zone_name is None:
        return cast("list[Any]", values)
    zone = pa.lib.string_to_tzinfo(zone_name)
    if zone_name in _UTC_NAMES:
        return [value.replace(tzinfo=zone) for value in values]
    utc = timezone.utc
    try:
        return [value.replace(tzinfo=utc).astimezone(zone) for value in values]
    except OverflowError:  # a value the zone's offset takes past year 1 or 9999: pyarrow's own error
        return column.to_pylist()


def _row_values(rows: Any, names: Iterable[str]) -> list[dict[str, Any]]:
    """The rows as dicts of ``names``: one list of values per column (:func:`_pylist`), then one
    dict per row built from the columns' lists (Arrow's own Table.to_pylist builds each row key by
    key, slower)."""
    names = list(names)
    columns = [_pylist(rows.column(name)) for name in names]
    return list(map(dict, map(zip, repeat(names), zip(*columns))))


def _records(spec: DataFrameSpec, rows: Any, start: int) -> Iterator[tuple[str, InputRecord]]:
    """The rows as ``(stream, InputRecord)``, offsets counting on from the partition's position. The
    order column's timestamps are checked as one column (:meth:`TimestampRule.column_fits`): when all
    fit, each record takes its seconds as they are; else every row is checked on its own, and one
    the rule refuses is a bad record (:func:`_checked_record`)."""
    keys = rows.column(spec.key).to_pylist()
    if spec.value is not None:
        values: list[Any] = _pylist(rows.column(spec.value))
    else:
        values = _row_values(rows, spec.columns)
    if spec.ts is None:
        return zip(repeat(spec.stream), map(InputRecord, count(start), keys, values, repeat(None)))
    seconds = _seconds(spec, rows.column(spec.order_by))
    if spec.timestamps.column_fits(seconds):  # seconds as a float, as every input gives them
        return zip(repeat(spec.stream), map(InputRecord, count(start), keys, values, seconds.to_pylist()))
    if spec.ts == "number":
        times: Iterable[Any] = pc.cast(rows.column(spec.order_by), "float64").to_pylist()
        per_second = None
    else:
        times = pc.cast(pc.cast(rows.column(spec.order_by), "timestamp[us]"), "int64").to_pylist()
        per_second = 1e6
    return zip(repeat(spec.stream), map(_checked_record, count(start), keys, values, times,
                                        repeat(spec.timestamps), repeat(per_second)))


def _seconds(spec: DataFrameSpec, column: Any) -> Any:
    """The order column (``spec.ts`` set) as event time in seconds, float64: a numeric one divided by
    its ``timestamp_unit``, a timestamp or date one from its microseconds. Each value is what
    :meth:`TimestampRule.seconds` gives for it (the same float division)."""
    if spec.ts == "number":
        times = pc.cast(column, pa.float64())
        if spec.timestamps.per_second != 1.0:
            times = pc.divide(times, spec.timestamps.per_second)
        return pc.add(times, 0.0)  # -0.0 is 0.0, as TimestampRule.seconds gives it
    micros = pc.cast(pc.cast(column, "timestamp[us]"), "int64")
    return pc.divide(pc.cast(micros, pa.float64()), 1e6)


def _checked_record(offset: int, key: Any, value: Any, ts: Any, rule: TimestampRule,
                    per_second: float | None) -> InputRecord:
    """The record of one row, its order column's value ``ts`` made event time by ``rule`` (a bad record
    when it refuses it)."""
    try:
        return InputRecord(offset, key, value, rule.seconds(ts, per_second))
    except BadTimestamp as exc:
        return InputRecord(offset, None, None, None, exc.problem, repr({"key": key, "timestamp": ts})[:1000])


def _arrow_rows(spec: DataFrameSpec, rows: Any, start: int) -> list[ArrowRows] | None:
    """The rows as one BatchTask batch (columns :data:`~localstate.core.task.BATCH_COLUMNS`), built
    from the Arrow columns as they are: no Python object per row. ``value`` is the ``value`` column,
    or a struct of every input column; ``timestamp`` the order column in seconds (float64) when it is
    numeric, a timestamp or a date, else null. None when a timestamp is one ``spec.timestamps`` refuses
    (the caller feeds the rows as records instead, that row a bad record)."""
    table = rows.combine_chunks()
    n = table.num_rows
    if not n:
        return []

    def column(name: str) -> Any:
        chunks = table.column(name).chunks
        return chunks[0] if len(chunks) == 1 else pa.concat_arrays(chunks)

    key = column(spec.key)
    if spec.value is not None:
        value = column(spec.value)
    else:
        value = pa.StructArray.from_arrays([column(name) for name in spec.columns], names=list(spec.columns))
    times = _seconds(spec, column(spec.order_by)) if spec.ts is not None else pa.nulls(n, pa.float64())
    if spec.ts is not None and times.null_count < n and not spec.timestamps.column_fits(times):
        return None  # a timestamp the rule refuses: the rows go as records, that one a bad record
    offsets = pa.array(np.arange(start, start + n, dtype=np.int64))
    schema = pa.schema([pa.field("key", key.type), pa.field("value", value.type),
                        pa.field("timestamp", pa.float64()), pa.field("offset", pa.int64())],
                       metadata={"localstate.stream": spec.stream})
    return [ArrowRows(spec.stream, pa.RecordBatch.from_arrays([key, value, times, offsets], schema=schema), start)]


def _query_batch(batch: int) -> int | None:
    """The micro-batch id Spark gave this task (:data:`BATCH_ID_PROPERTY`), None outside a streaming
    query; BatchOrderError naming both ids if it is not ``batch`` (the driver passed another query's
    id, or the wrong one)."""
    context = TaskContext.get()
    value = context.getLocalProperty(BATCH_ID_PROPERTY) if context is not None else None
    if value is None:
        return None
    if int(value) != batch:
        raise BatchOrderError(
            f"batch id {batch} passed to localstate does not match the micro-batch Spark runs ({BATCH_ID_PROPERTY}="
            f"{value})", batch=batch, query_batch=int(value),
            hint="pass foreachBatch's own batch id to run_batch (or use foreach_batch)")
    return int(value)


class DataFramePartition(PartitionTask):
    """A DataFrame-step batch of one job partition: the batch's Arrow rows as records, on the
    partition's instance checked out of this worker, with its outputs in the batch's own file
    (:class:`BatchOutputs`); a batch the instance applied before is skipped."""

    def __init__(self, task: _BatchTask, partition: int, rows: Any) -> None:
        super().__init__(task.spec.job, partition, fault=fault_for(task.fault, partition, task.batch),
                         keep_open=task.keep_open)
        self.task, self.rows = task, rows

    def open(self) -> Lease:
        job, partition = self.job, self.partition
        return checkout(job, partition, self.task.run_id, lambda: BatchOutputs(job, partition),
                        tune=self.task.tune_worker)

    def applied(self, lease: Lease) -> bool:
        return lease.instance.batch is not None and lease.instance.batch >= self.task.batch

    def begin(self, lease: Lease) -> None:
        outputs = cast(BatchOutputs, lease.sink.inner)  # run ids of this path are its own: see run_batch
        outputs.begin(self.task.batch, lease.instance.batch)

    def records(self, lease: Lease) -> Iterable[Any]:
        spec = self.task.spec
        start = lease.instance.position(spec.stream)
        if isinstance(lease.instance.task, BatchTask):  # Arrow end to end
            rows = _arrow_rows(spec, self.rows, start)
            if rows is not None:
                return rows
        return _records(spec, self.rows, start)

    def end(self, lease: Lease) -> None:
        lease.instance.batch = self.task.batch

    def check_in(self, lease: Lease, prepared: Checkpoint | None) -> None:
        checkin(lease, prepared, keep=self.keep_open)


def _run_partition(task: _BatchTask, partition: int, rows: Any) -> dict[str, Any]:
    """Apply the batch to one job partition, unless its checkpoint already holds it; returns the
    prepared checkpoint (the driver saves it) or a deterministic error, pickled.

    The partition's instance is checked out of this Python worker (:func:`~.instances.checkout`):
    the one kept open since the partition's last batch if the committed checkpoint is exactly what
    that batch prepared, else a fresh one recovered to the checkpoint. With ``keep_open`` it is kept
    open afterwards for the partition's next batch."""
    batch = task.batch
    result: dict[str, Any] = {"partition": partition, "applied": False, "checkpoint": None, "records": 0,
                              "outputs": 0, "reused": False, "query_batch": None, "pid": os.getpid(),
                              "started": 0.0, "error": None, "counts": "{}", **dict.fromkeys(TASK_PHASES, 0.0)}
    try:
        result["query_batch"] = _query_batch(batch)
        job = task.spec.job
        add_task_paths(job)
        committed = checkpoint_store(job).load(partition)
        if committed is not None and committed.batch is not None and committed.batch >= batch:
            return result  # applied before: the driver serves the outputs it stored
        done = DataFramePartition(task, partition, rows).run()
        if done is None:
            return result
        phases = done.timings
        result.update(applied=True, checkpoint=done.checkpoint.to_json(), records=done.records,
                      outputs=done.outputs, reused=done.reused, counts=json.dumps(done.counts),
                      open=phases["wait"] + phases["open"],
                      convert=phases["read"], process=phases["process"],
                      commit=sum(phases[name] for name in ("changelog", "store_flush", "outputs", "close")))
    except (Exception, SystemExit) as exc:
        result["error"] = executor_failure(exc, batch, partition)  # re-raises what Spark should retry
    return result


# -- driver -------------------------------------------------------------------------------------------
def _job(job: JobConfig | str | os.PathLike[str]) -> JobConfig:
    """The job bound to its current state epoch (:func:`~localstate.runtime.layout.resolve_epoch`)."""
    return resolve_epoch(job if isinstance(job, JobConfig) else load_job_config(job))


@contextmanager
def _job_settings(spark: Any) -> Iterator[None]:
    """The session settings of localstate's own Spark job while it is planned and run, the session's
    own restored afterwards: :data:`ARROW_BATCH_ROWS` per Arrow batch if the session did not set a
    size (a size the user set is kept, even Spark's default value), and adaptive query execution
    off (:data:`_AQE_CONF`: the job's one shuffle has the job's partition count, which AQE keeps,
    and AQE would run the shuffle's map stage as a Spark job of its own and plan the rest again:
    one more job per micro-batch)."""
    conf = spark.conf
    changed: list[tuple[str, str | None]] = []  # (setting, the session's own value; None: not set)
    try:
        if conf.get(_ARROW_BATCH_CONF, None) is None:  # None: not set in this session
            conf.set(_ARROW_BATCH_CONF, str(ARROW_BATCH_ROWS))
            changed.append((_ARROW_BATCH_CONF, None))
        adaptive = conf.get(_AQE_CONF, None)
        if adaptive is None or adaptive.strip().lower() != "false":
            conf.set(_AQE_CONF, "false")
            changed.append((_AQE_CONF, adaptive))
        yield
    finally:
        for name, value in reversed(changed):
            if value is None:
                conf.unset(name)
            else:
                conf.set(name, value)


@contextmanager
def _batch_property(context: Any, task: _BatchTask) -> Iterator[None]:
    """:data:`BATCH_PROPERTY` set to ``task``'s fields on this thread (the batch's job inherits it)
    while the job runs, then unset."""
    context.setLocalProperty(BATCH_PROPERTY, task.property_value())
    try:
        yield
    finally:
        context.setLocalProperty(BATCH_PROPERTY, None)


def run_batch(df: Any, job: JobConfig | str | os.PathLike[str], *, key: str, batch_id: int | None = None,
              order_by: str | None = None, value: str | None = None, stream: str = "dataframe",
              keep_open: bool = False, fault: Mapping[str, Any] | None = None, partitioned: bool = False,
              progress: Callable[[DataFrameBatch], None] | None = None, timestamp_unit: str = "s",
              min_timestamp: Any = False, max_timestamp: Any = False) -> Any:
    """Apply the batch ``df`` to the job's state, exactly once per ``batch_id``, and return the task's
    outputs as a DataFrame (:data:`OUTPUT_SCHEMA`), read from files kept until the next batch.

    ``partitioned``: ``df``'s Spark partition ``p`` holds only rows whose key belongs to job partition
    ``p`` (a Kafka topic with the job's partition count, written with Kafka's default partitioner,
    read through ``localstate-kafka``): the rows are applied where they are, in their input order
    (then by ``order_by``), in one stage with no shuffle; a row in another partition fails the batch
    (no partition commits it) with an InputError naming its key.

    ``batch_id``: the micro-batch id (foreachBatch's); None: the batch after the last one applied (a
    batch DataFrame). An id the job already applied is not applied again: its outputs are returned as
    they were. ``keep_open``: the Python workers keep their partition's instance open for the next
    batch (what :func:`foreach_batch` does; :func:`release` closes them). ``progress`` is called with
    the batch's :class:`DataFrameBatch`. ``timestamp_unit``, ``min_timestamp``, ``max_timestamp``: how
    a numeric ``order_by`` column becomes event time, and the plausible range of event times, as an
    input's options of those names (default: seconds, no bounds); a row outside them fails the batch
    with a TimestampError. ``fault`` (tests and demos only): ``{"partition", "batch",
    "after", "marker"}`` SIGKILLs the Python worker feeding that partition after ``after`` records,
    once (see :mod:`~localstate.runtime.partition.faults`)."""
    job = _job(job)
    spec = dataframe_spec(df, job, key=key, order_by=order_by, value=value, stream=stream,
                          timestamp_unit=timestamp_unit, min_timestamp=min_timestamp, max_timestamp=max_timestamp)
    add_task_paths(job)
    load_task_class(job.task)  # a task that cannot be imported fails here, before Spark runs anything
    checkpoints = checkpoint_store(job)
    committed = checkpoints.load_all(job.partitions)
    applied = [c.batch for c in committed.values() if c is not None and c.batch is not None]
    last = max(applied, default=None)
    if batch_id is None:
        batch_id = 0 if last is None else last + 1
    if type(batch_id) is not int or batch_id < 0:
        raise BatchOrderError(f"batch id must be a non-negative integer, got {batch_id!r}", batch=batch_id)
    if last is not None and batch_id < last:
        raise BatchOrderError(
            f"batch {batch_id} goes backwards: job {job.name!r} has applied batch {last}, and only the outputs of "
            "each partition's last batch are kept", batch=batch_id, committed=last, job=job.name,
            path=str(checkpoints.root),
            hint="a query's checkpointLocation must stay with the job's state: restore it, or start the job "
                 "over with `localstate reset`")
    if any(checkpoint is None for checkpoint in committed.values()):
        create_changelog_streams(job)  # a partition commits its first batch only after its streams exist
    spark = df.sparkSession
    context = spark.sparkContext
    started = time.perf_counter()
    job_df = _batch_job(df, spec, partitioned)
    # "dataframe:" keeps these run ids apart from `localstate run`'s (their instances have other sinks).
    # A fresh exchange directory per call: a batch Spark executes again exchanges from scratch.
    exchange = safe_join(checkpoints.root, "exchange", uuid.uuid4().hex) if keep_open else None
    _per_context(context, "retries checked", lambda: warn_without_retries(context))
    application = _per_context(context, "application", lambda: context.applicationId)
    master = _per_context(context, "master", lambda: context.master)  # a Py4J call each time otherwise
    task = _BatchTask(spec, batch_id, f"dataframe:{application}", keep_open,
                      SparkConfig.of(job, master=master).affinity_setting, fault,
                      None if exchange is None else str(exchange), partitioned)
    try:
        if exchange is not None:
            try:
                ensure_dir(checkpoints.root, exchange)
            except OSError as exc:
                raise os_error(exc, "create the batch's row exchange directory", exchange, CheckpointIOError,
                               batch=batch_id) from exc
        with _job_settings(spark), _batch_property(context, task):
            job_df._jdf.queryExecution().executedPlan()  # planned here (collect reuses it): timed apart
            planned, started_at = time.perf_counter(), time.time()
            results = job_df.collect()
    except LocalStateError:
        raise
    except Exception as exc:  # Py4JJavaError: the Spark job failed after its retries
        raise spark_failure(exc, batch_id) from None
    finally:
        if exchange is not None:
            shutil.rmtree(exchange, ignore_errors=True)  # the job is over: no task reads it any more
    errors = [r["error"] for r in results if r["error"] is not None]
    if errors:
        raise pickle.loads(errors[0])
    report = DataFrameBatch(batch_id)
    report.plan_seconds = planned - started
    report.first_task_seconds = max(0.0, min((r["started"] for r in results), default=started_at) - started_at)
    for row in results:
        if row["applied"]:
            checkpoint = Checkpoint.from_json(row["checkpoint"], f"batch {batch_id} partition {row['partition']}")
            # Fenced by the generation the task's instance took at open, like every commit.
            checkpoints.save(checkpoint, expect_generation=checkpoint.generation)
            commit_recorded(job, checkpoint.partition, checkpoint.transactions)  # the task left them open
            committed[row["partition"]] = checkpoint
            report.applied.append(row["partition"])
            report.records += row["records"]
            report.outputs += row["outputs"]
            merge_counts(report.counts, json.loads(row["counts"] or "{}"))
            if row["reused"]:
                report.reused.append(row["partition"])
        else:
            report.replayed.append(row["partition"])
        report.query_batch = row["query_batch"] if row["query_batch"] is not None else report.query_batch
        report.workers[row["partition"]] = row["pid"]
        for phase in TASK_PHASES:
            report.task_seconds[phase] = report.task_seconds.get(phase, 0.0) + row[phase]
        report.busiest_task = max(report.busiest_task, sum(row[phase] for phase in TASK_PHASES))
    report.seconds = time.perf_counter() - started
    if progress is not None:
        progress(report)
    return batch_outputs(spark, job, batch_id, committed)


_LOCAL_MASTER = re.compile(r"local(?:\[\s*([^,\]]+)\s*(?:,\s*(\d+)\s*)?\])?$")


def task_attempts(master: str, conf: Mapping[str, str]) -> int | None:
    """How many times Spark runs a failed task of a context with ``master`` and ``conf`` (1: never
    retried). Local masters take it from the master string alone (``local[N,F]``: F; ``local``,
    ``local[N]``, ``local[*]``: 1, whatever ``spark.task.maxFailures`` says); other masters from
    ``spark.task.maxFailures`` (default 4). None: a master this cannot read."""
    match = _LOCAL_MASTER.match(master.strip())
    if match is not None:
        return int(match[2]) if match[2] else 1
    try:
        return int(conf.get("spark.task.maxFailures", "4"))
    except ValueError:
        return None


def warn_without_retries(context: Any) -> bool:
    """Log one WARNING (:func:`run_batch` calls this once per SparkContext) when ``context`` never
    retries a failed task: the first killed Python worker, lost executor or transient I/O error then
    fails the query, where a retry would recover the partition to its checkpoint. Returns whether it
    warned."""
    master = str(context.master)
    conf = dict(context.getConf().getAll())
    attempts = task_attempts(master, conf)
    if attempts is None or attempts > 1:
        return False
    match = _LOCAL_MASTER.match(master.strip())
    if match is not None:
        threads = (match[1] or "1").strip()
        advice = (f"use master 'local[{threads},4]' (local[N,F]: F attempts per task; spark.task.maxFailures "
                  "does not apply to local masters)")
    else:
        advice = "set spark.task.maxFailures to 4 (Spark's default) or more"
    log.warning("localstate: this SparkContext (master %s) never retries a failed task, so the first killed "
                "Python worker or lost executor fails the query instead of being retried from the partition's "
                "checkpoint; %s. See docs/spark-users.md, \"The session\".", master, advice)
    return True


def routed(df: Any, spec: DataFrameSpec, jvm: bool | None = None) -> Any:
    """``df`` with its rows' job partition (:func:`partition_column`; ``jvm``: route in the JVM, None:
    if :func:`jvm_has_murmur2`) and sequence number, shuffled so that job partition ``p`` is Spark
    partition ``p``. The sequence number is fixed before the shuffle (input partition and row
    position), so it is the same each time Spark executes the batch again."""
    if jvm is None:
        jvm = jvm_has_murmur2(df.sparkSession)

    # Few DataFrame calls, SQL text rather than Column objects: each DataFrame call is a Py4J round
    # trip and an analysis of the plan, each Column function several round trips, per micro-batch.
    projection = _projection(spec)
    partition = _partition_sql(spec, jvm)
    if partition is not None:
        prepared = df.selectExpr(*projection, f"{partition} AS {_PARTITION}")
    else:  # the Arrow UDF is a Column, not SQL text
        prepared = df.select(*map(F.expr, projection), partition_column(spec, jvm).alias(_PARTITION))
    return prepared.repartition(spec.job.partitions, F.expr(_route_sql(spec)))


def _projection(spec: DataFrameSpec, partitioned: bool = False) -> list[str]:
    """The input columns under positional names (:data:`_COLUMN`), then, for rows that go through the
    shuffle, each row's sequence number (fixed in this projection: before the shuffle)."""
    projection = [f"{_sql_name(name)} AS {_COLUMN}{index}" for index, name in enumerate(spec.columns)]
    if not partitioned:
        projection.append(f"monotonically_increasing_id() AS {_SEQ}")
    return projection


def _route_sql(spec: DataFrameSpec) -> str:
    """The shuffle's expression: the route value (:func:`routes`, bigint literals: Spark hashes a long
    otherwise than an int) of each row's job partition. An expression, not a column: the apply stage
    gets no column it ignores."""
    route_of = ", ".join(f"{value}L" for value in routes(spec.job.partitions))
    return f"element_at(array({route_of}), {_PARTITION} + 1)"


class _ApplyStage:
    """The parts of a batch's Spark job that are the same for every batch of one DataFrame shape
    (``spec``), made once per SparkContext: the apply stage's Python UDF (its function pickled and its
    JVM objects made, some forty Py4J calls) and the routing projection and shuffle expression as JVM
    objects. A batch then costs three DataFrame calls (a Py4J call and an analysis each): project,
    repartition (not with ``partitioned``), mapInArrow; the batch's own fields go to the tasks as a
    local property (:data:`BATCH_PROPERTY`). Keys hashed in the JVM only (:func:`_partition_sql`);
    :meth:`make` says None otherwise, and :func:`routed` with ``mapInArrow`` builds the job."""

    def __init__(self, spark: Any, spec: DataFrameSpec, partitioned: bool, partition_sql: str | None) -> None:
        from pyspark.sql.classic.column import _to_seq  # why: PySpark internals, absent from some versions: make()

        context = spark.sparkContext
        self.spec, self.partitioned = spec, partitioned
        projection = _projection(spec, partitioned)
        if partition_sql is not None:
            projection.append(f"{partition_sql} AS {_PARTITION}")
        names = [text.rsplit(" AS ", 1)[1] for text in projection]
        self._projection = _to_seq(context, projection)
        self._route = _to_seq(context, [F.expr(_route_sql(spec))._jc])
        udf = pandas_udf(_apply(spec, partitioned), returnType=_RESULT_SCHEMA,  # type: ignore[call-overload]
                         functionType=PythonEvalType.SQL_MAP_ARROW_ITER_UDF)
        environment = context.environment
        context.environment = {**environment, APPLY_WORKERS_ENV: "1"}  # read as the UDF's JVM function is made
        try:
            self._udf = udf(*map(F.col, names))  # by name: resolved against each batch's plan
        finally:
            context.environment = environment
        self._udf_column = self._udf._jc

    @classmethod
    def make(cls, spark: Any, spec: DataFrameSpec, partitioned: bool) -> "_ApplyStage | None":
        """The stage for ``spec`` in ``spark``'s context, made once and kept (a few per context); None
        where the rows are routed by the Arrow UDF (binary keys, a JVM without murmur2) or this PySpark
        lacks what the stage uses."""
        partition_sql = None if partitioned else _partition_sql(spec, jvm_has_murmur2(spark))
        if not partitioned and partition_sql is None:
            return None
        stages = _context_facts(spark.sparkContext).setdefault("apply stages", [])
        for stage in stages:
            if stage.spec == spec and stage.partitioned == partitioned:
                return cast("_ApplyStage", stage)
        try:
            stage = cls(spark, spec, partitioned, partition_sql)
        except (ImportError, AttributeError):  # another PySpark's internals: the public API builds the job
            return None
        stages.append(stage)
        del stages[:-_STAGES_KEPT]
        return stage

    def job(self, df: Any) -> Any:
        """The batch's job over ``df``: a DataFrame of the apply stage's result rows."""

        jdf = df._jdf.selectExpr(self._projection)
        if not self.partitioned:
            jdf = jdf.repartition(self.spec.job.partitions, self._route)
        return DataFrame(jdf.mapInArrow(self._udf_column, False, None), df.sparkSession)


APPLY_WORKERS_ENV = "LOCALSTATE_APPLY_WORKERS"
"""An environment variable the apply stage's Python function carries (and nothing else of the
session): Spark keeps one pool of idle Python workers per set of environment variables, so the apply
tasks get workers of their own. With the session's pool, a stage that also runs Python for its input
(a Python data source such as ``localstate-kafka``, with ``partitioned``: no stage boundary between
the read and the apply) gives each task two workers, taken from the pool in the order they went
idle, so the worker that applied partition p (and keeps it open) reads the input of the next batch
while another worker applies p, reopening it: no instance would stay open between micro-batches."""

_STAGES_KEPT = 8
"""Apply stages kept per SparkContext (one per DataFrame shape a query uses; a new one per
``run_batch`` call with a job loaded from its file)."""


def _batch_job(df: Any, spec: DataFrameSpec, partitioned: bool) -> Any:
    """The batch's Spark job over ``df``: a DataFrame of the apply stage's result rows, through the
    kept :class:`_ApplyStage` where there is one, else through the public DataFrame API."""
    stage = _ApplyStage.make(df.sparkSession, spec, partitioned)
    if stage is not None:
        return stage.job(df)
    if partitioned:
        return df.selectExpr(*_projection(spec, partitioned=True)).mapInArrow(_apply(spec, True), _RESULT_SCHEMA)
    return routed(df, spec).mapInArrow(_apply(spec, False), _RESULT_SCHEMA)


def release(job: JobConfig | str | os.PathLike[str]) -> None:
    """Make the Python workers close the instances of ``job`` they keep open (:func:`foreach_batch`,
    ``keep_open``), waiting until each partition is free: call it after stopping a query, before
    opening the job's state from this process (``localstate run``, a TaskInstance). Idle Python
    workers also give a partition back on demand to any localstate task that asks for it, and they
    close with the SparkContext."""
    job = _job(job)
    release_partitions(checkpoint_store(job), range(job.partitions))


def batch_outputs(spark: Any, job: JobConfig, batch_id: int,
                  committed: Mapping[int, Checkpoint | None] | None = None) -> Any:
    """The outputs of ``batch_id`` from every partition whose checkpoint holds it, as a DataFrame
    (files without rows are left out: a batch that sent nothing gives the sink an empty local relation).
    ``committed``: the partitions' committed checkpoints if the caller has them (not read again)."""
    if committed is None:
        committed = checkpoint_store(job).load_all(job.partitions)
    files = []
    for partition in range(job.partitions):
        checkpoint = committed.get(partition)
        if checkpoint is None or checkpoint.batch != batch_id:
            continue
        path = BatchOutputs.path(job, partition, batch_id)
        rows = checkpoint.outputs.get(OUTPUT_ROWS)
        try:
            if rows is None:  # a checkpoint written before OUTPUT_ROWS: every batch has a file
                rows = pq.read_metadata(path).num_rows
            elif rows and not path.is_file():
                raise FileNotFoundError(path)
        except FileNotFoundError:
            raise BatchOrderError(f"the outputs of batch {batch_id} of partition {partition} are missing",
                                  batch=batch_id, partition=partition, path=str(path),
                                  hint="the state directory was changed by hand; restore it, or start the "
                                       "job over with `localstate reset`") from None
        if rows:
            files.append(str(path))
    if not files:
        return _no_outputs(spark)
    return spark.read.schema(OUTPUT_SCHEMA).parquet(*files)


def _no_outputs(spark: Any) -> Any:
    """An empty DataFrame of :data:`OUTPUT_SCHEMA` in ``spark``'s session. Built once per JVM session
    and kept (one per SparkContext): a streaming query hands every micro-batch a new Python session
    around the same JVM session, which one Py4J call recognises, where building it costs a parse and
    an analysis. The DataFrame returned belongs to ``spark`` itself."""
    facts, session = _context_facts(spark.sparkContext), spark._jsparkSession
    kept = facts.get("no outputs")
    if kept is not None and (kept[0] is session or kept[0].equals(session)):
        return DataFrame(kept[1], spark)
    # A filter that is always false becomes an empty local relation (Spark's PruneFilters): no
    # code to generate, no Range to scan. (createDataFrame([]) would run a Python RDD.)
    columns = ", ".join(f"CAST(NULL AS {kind}) AS {name}" for name, kind in
                        (column.split() for column in OUTPUT_SCHEMA.split(", ")))
    empty = spark.sql(f"SELECT {columns} WHERE false")  # one Py4J call
    facts["no outputs"] = (session, empty._jdf)
    return empty


def foreach_batch(job: JobConfig | str | os.PathLike[str], *, key: str, sink: Callable[[Any, int], None],
                  **options: Any) -> Callable[[Any, int], None]:
    """A ``writeStream.foreachBatch`` function: each micro-batch goes through :func:`run_batch` (with
    foreachBatch's batch id) and its outputs to ``sink(outputs, batch_id)``. Make the sink idempotent
    per batch id (overwrite a per-batch location, Delta's ``txnAppId``/``txnVersion``): after a failure
    Spark calls it again for the same batch, with the same rows. The Python workers keep their
    partitions' instances open between micro-batches unless the job sets ``[spark] worker_affinity =
    false`` (or ``keep_open=False`` is passed): after the query stops, :func:`release` closes them.
    ``options`` are :func:`run_batch`'s (``order_by``, ``partitioned``, ``progress``, ...)."""
    job = _job(job)

    def handle(df: Any, batch_id: int) -> None:
        if "keep_open" not in options:  # decided once, by the query's master: worker affinity is for local ones
            options["keep_open"] = SparkConfig.of(job, master=df.sparkSession.sparkContext.master).worker_affinity
        sink(run_batch(df, job, key=key, batch_id=int(batch_id), **options), int(batch_id))

    return handle
