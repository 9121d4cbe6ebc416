"""Like with like, for ``python -m bench spark``: Spark's own stateful streaming aggregation and the
DataFrame step (``localstate.spark.foreach_batch``) reading the SAME streaming source, both shuffling
by key, in the same SparkContext (local[2]), one after the other, each after an untimed warm-up query.

- Spark: ``groupBy(user_id).count()``, output mode update, its RocksDB state store provider with
  changelog checkpointing, ``spark.sql.shuffle.partitions`` = the job's partitions, a ``noop`` sink,
  ``trigger(availableNow=True)``, a checkpointLocation.
- localstate: the same stream through ``foreach_batch`` (kv store on the bench's backend), with the
  per-record task (``PageViewCounter``) and with the batch task (``PageViewCounterBatch``); its
  outputs to a ``noop`` sink; the kept instances closed (``release``) inside the timed run.

Sources: Parquet files (one per micro-batch, ``maxFilesPerTrigger`` 1: the columns ``user_id, page,
ts``, rows fed in ``ts`` order) and Kafka through localstate's own Python Data Source
(``localstate-kafka``, a Tansu broker the bench starts; events keyed by user, produced untimed,
``max_records_per_trigger`` a tenth of them: ten micro-batches; ``CAST(key AS STRING) AS user_id``,
the value and the record timestamp, rows fed in offset order). Kafka also runs the DataFrame step
told that the input is partitioned by key already (``partitioned=True``: topic partition p is job
partition p, every row checked): one stage, no shuffle; that row is labelled as such.

Timed: from ``start()`` until the query ends (and the DataFrame step's instances are closed).
Correctness: Spark's counts read back from its state store (the ``statestore`` reader), localstate's
from its stores; both equal ``numpy.bincount`` of the events.
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

__all__ = ["SPARK_STATE_CONF", "ParquetSource", "KafkaSource", "compare_on_source"]

SPARK_STATE_CONF = {
    "spark.sql.streaming.stateStore.providerClass":
        "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
    "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true",
}
"""Spark's stateful aggregation as ../shared/peers/spark_peer.py runs it: the RocksDB state store with
changelog checkpointing."""


@dataclass
class ParquetSource:
    """The events as Parquet files, one micro-batch each."""

    directory: Path
    name: str = "Parquet"
    order_by: str | None = "ts"

    def stream(self, spark: Any) -> Any:
        return (spark.readStream.schema("user_id string, page string, ts long").option("maxFilesPerTrigger", 1)
                .parquet(str(self.directory)))

    def close(self) -> None:
        """Nothing to close: the files are removed with the bench's directory."""


@dataclass
class KafkaSource:
    """The events in a Kafka topic (one partition per job partition, keyed by user), read through the
    ``localstate-kafka`` streaming source in micro-batches of ``per_trigger`` records."""

    servers: str
    topic: str
    per_trigger: int
    name: str = "Kafka"
    order_by: str | None = None  # offset order: the rows' order within each topic partition

    def stream(self, spark: Any) -> Any:
        from localstate.runtime.spark.kafka_source import register
        register(spark)
        return (spark.readStream.format("localstate-kafka").option("bootstrap_servers", self.servers)
                .option("topic", self.topic).option("max_records_per_trigger", self.per_trigger).load()
                .selectExpr("CAST(key AS STRING) AS user_id", "value", "timestamp"))

    def close(self) -> None:
        """Nothing to close: the broker is the caller's."""


def produce_events(servers: str, topic: str, events: int, users: int, seed: int, partitions: int) -> np.ndarray:
    """The bench's events (same generator, same order as the other sources) produced to ``topic``
    (created with ``partitions`` partitions), keyed by user and placed by Kafka's partitioner (murmur2,
    ``partition_for``); each value is ``{"page": ..., "ts": ...}``. Returns the expected counts."""
    from localstate.changelog.kafka.client import CONNECTION_OPTIONS, client_settings
    from localstate.changelog.kafka.io import ensure_topic, produce
    from localstate.core.options import validate_options
    from localstate.core.partitioner import partition_for

    settings = client_settings(validate_options(CONNECTION_OPTIONS, {"bootstrap_servers": servers}, "bench"))
    ensure_topic(settings, topic, partitions, -1, create=True)
    rng = np.random.default_rng(seed)
    uid = rng.integers(0, users, events, dtype=np.int64)
    pid = rng.integers(0, 1000, events, dtype=np.int64)
    names = [f"user-{u:08d}".encode() for u in range(users)]
    where = [partition_for(name, partitions) for name in names]
    step = 50_000
    for first in range(0, events, step):
        produce(settings, topic, [(names[u], json.dumps({"page": f"/page/{p:04d}", "ts": 1_700_000_000 + first + i},
                                                        separators=(",", ":")).encode(), where[u])
                                  for i, (u, p) in enumerate(zip(uid[first:first + step].tolist(),
                                                                 pid[first:first + step].tolist()))])
    return np.bincount(uid, minlength=users)


def _spark_count(spark: Any, source: Any, checkpoint: Path) -> float:
    """Spark's own stateful aggregation over ``source``: seconds from start() to the query's end."""
    counts = source.stream(spark).groupBy("user_id").count()
    writer = (counts.writeStream.outputMode("update").format("noop").option("checkpointLocation", str(checkpoint))
              .trigger(availableNow=True))
    started = time.perf_counter()
    query = writer.start()
    query.awaitTermination()
    seconds = time.perf_counter() - started
    if query.exception() is not None:
        raise RuntimeError(f"Spark's aggregation failed: {query.exception()}")
    return seconds


def _spark_counts(spark: Any, checkpoint: Path, users: int) -> np.ndarray:
    """Every user's count as Spark's state store holds it after the query (0: a user it lacks, as a
    user without events has no row; a user it lacks that had events then differs from the expected)."""
    rows = spark.read.format("statestore").load(str(checkpoint)).selectExpr("key.user_id AS u", "value.count AS c") \
        .toPandas()
    counts = np.zeros(users, dtype=np.int64)
    counts[rows["u"].str.slice(5).astype("int64").to_numpy()] = rows["c"].astype("int64").to_numpy()
    return counts


def _dataframe_step(spark: Any, job: Any, source: Any, checkpoint: Path, reports: list[Any],
                    partitioned: bool = False) -> float:
    """The DataFrame step over ``source``: seconds from start() to the query's end and the kept
    instances closed."""
    from localstate.runtime.spark.dataframe import foreach_batch, release

    def sink(outputs: Any, batch_id: int) -> None:
        outputs.write.format("noop").mode("overwrite").save()

    options = {"partitioned": True} if partitioned else {}
    handler = foreach_batch(job, key="user_id", order_by=source.order_by, sink=sink, progress=reports.append,
                            **options)
    writer = (source.stream(spark).writeStream.foreachBatch(handler).option("checkpointLocation", str(checkpoint))
              .trigger(availableNow=True))
    started = time.perf_counter()
    query = writer.start()
    query.awaitTermination()
    release(job)
    seconds = time.perf_counter() - started
    if query.exception() is not None:
        raise RuntimeError(f"the DataFrame step failed: {query.exception()}")
    return seconds


@dataclass
class Measured:
    """One timed run: its label, seconds, whether its counts were exact, the DataFrame batch reports."""

    label: str
    seconds: float
    correct: bool
    reports: list[Any]


_NOT_STARTED = "failed to connect back"
"""What Spark says when a Python process it started (the ``localstate-kafka`` source's reader on the
driver) did not connect back within its 10 s: on a loaded machine starting one can take longer. The
query then fails before its first micro-batch, having read and applied nothing."""


def _attempts(run: Callable[[Path], Any], where: Path, tries: int = 3) -> Any:
    """``run(directory)`` in ``where/attempt-<n>``, again in a fresh directory when the query failed
    because a Python process Spark started did not connect back in time (:data:`_NOT_STARTED`)."""
    for attempt in range(tries):
        try:
            return run(where / f"attempt-{attempt}")
        except Exception as exc:  # noqa: BLE001 - StreamingQueryException or RuntimeError
            if _NOT_STARTED not in str(exc) or attempt == tries - 1:
                raise
            RETRIED.append(f"{where.name}: {_NOT_STARTED}")
    raise AssertionError("unreachable")


RETRIED: list[str] = []
"""The measurements run again because a query could not start its source (:func:`_attempts`)."""


def compare_on_source(spark: Any, root: Path, source: Any, warm_source: Any, expected: np.ndarray,
                      warm_expected: np.ndarray, make_job: Callable[[Path, str], Any],
                      read_counts: Callable[[Any, int], np.ndarray], rounds: int = 1,
                      tasks: tuple[str, ...] = ("record", "batch"), partitioned: bool = False) -> list[Measured]:
    """Spark's aggregation, then the DataFrame step with each of ``tasks`` (and, with ``partitioned``,
    each of ``tasks`` again told the input is partitioned by key), ``rounds`` times, alternating, each
    kind after one untimed warm-up query on ``warm_source`` (in the first round). ``make_job(directory,
    task)`` gives a job (config) whose state lives in ``directory``."""
    from localstate.runtime.spark.dataframe import release

    users = len(expected)
    variants: list[tuple[str, str | None, bool]] = [("spark", None, False)]
    variants += [("dataframe", task, False) for task in tasks]
    if partitioned:
        variants += [("dataframe", task, True) for task in tasks]
    runs: list[Measured] = []
    for round_index in range(rounds):
        for kind, task, by_key in variants:
            name = f"{kind}-{task or 'count'}{'-partitioned' if by_key else ''}"
            label = _label(source.name, kind, task, by_key)
            where = root / f"{source.name.lower()}-{name}-{round_index}"
            if kind == "spark":
                def spark_run(directory: Path) -> Measured:
                    directory.mkdir(parents=True)
                    if round_index == 0:
                        _spark_count(spark, warm_source, directory / "warm-query")
                    seconds = _spark_count(spark, source, directory / "query")
                    correct = bool(np.array_equal(_spark_counts(spark, directory / "query", users), expected))
                    return Measured(label, seconds, correct, [])

                runs.append(_attempts(spark_run, where))
                continue

            def dataframe_run(directory: Path) -> Measured:
                directory.mkdir(parents=True)
                if round_index == 0:
                    warm_job = make_job(directory / "warm", task)  # type: ignore[arg-type]
                    _dataframe_step(spark, warm_job, warm_source, directory / "warm-query", [], by_key)
                    release(warm_job)
                    if not np.array_equal(read_counts(warm_job, len(warm_expected)), warm_expected):
                        raise RuntimeError(f"{label}: wrong counts after the warm-up")
                job = make_job(directory / "job", task)  # type: ignore[arg-type]
                reports: list[Any] = []
                seconds = _dataframe_step(spark, job, source, directory / "query", reports, by_key)
                correct = bool(np.array_equal(read_counts(job, users), expected))
                return Measured(label, seconds, correct, reports)

            runs.append(_attempts(dataframe_run, where))
            shutil.rmtree(where, ignore_errors=True)
    return runs


def _label(source: str, kind: str, task: str | None, partitioned: bool) -> str:
    if kind == "spark":
        return f"{source}: Spark groupBy(key).count(), RocksDB state store"
    what = "per-record task" if task == "record" else "batch task"
    return f"{source}: DataFrame step, {what}" + (", input already partitioned by key (no shuffle)" if partitioned
                                                  else "")
