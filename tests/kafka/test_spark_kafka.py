"""Kafka inputs and outputs of Spark jobs, end to end on local Spark and a real broker (Tansu).

- the windowed-counts and stream-table-join examples with Kafka inputs, Kafka outputs and Kafka
  changelogs, exact against independent computations over the generator's records;
- a failed batch re-delivers the outputs its successful partitions already flushed (at-least-once,
  documented), and the ``localstate-producer``/``localstate-seq`` headers identify every duplicate;
- broker unreachable at start, wrong partition count, missing topic, a frozen broker at an output
  flush: clear typed errors naming the servers, within the configured timeouts;
- the ``localstate-kafka`` Python Data Source: topic partition p is Spark partition p, writes are
  placed by murmur2, streaming reads resume from their checkpoint.
"""

from __future__ import annotations

import json
import shutil
import tomllib
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from localstate.changelog.kafka.client import CONNECTION_OPTIONS, client_settings
from localstate.changelog.kafka.devbroker import free_port
from localstate.core.config import JobConfig, parse_job_config
from localstate.core.options import validate_options
from localstate.core.partitioner import partition_for
from localstate.runtime.spark.continuous import ContinuousRunner
from localstate.runtime.spark.runner import SparkJobRunner, spark_context
from localstate.core.stream import open_output
from localstate.streams.generator import generate
from localstate.changelog.kafka.streams import (PRODUCER_HEADER, SEQ_HEADER, KafkaOutput, copy_input_to_topic, end_offsets,
                                           ensure_topic, pooled_consumer, produce, read_records, release_consumer)
from localstate.errors import InputError, OutputError
from localstate.testing.kafka import read_committed

pytestmark = [pytest.mark.kafka, pytest.mark.spark]

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"


@pytest.fixture(scope="module")
def spark():
    """One local Spark (and SparkSession, with ``localstate-kafka`` registered) for the module."""
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    from localstate.runtime.spark.kafka_source import register

    existing = SparkContext._active_spark_context
    context = spark_context("local[2]", "localstate-kafka-tests")
    session = SparkSession(context)
    register(session)
    yield session
    if existing is None:
        session.stop()  # stops the context too; a later module starts its own


def _settings(servers: str) -> dict[str, Any]:
    return client_settings(validate_options(CONNECTION_OPTIONS, {"bootstrap_servers": servers}, "test"))


def _keyed_topic(settings: dict[str, Any], topic: str, sent: list[tuple[str, str]]) -> None:
    """A topic of 3 partitions holding ``sent``'s (key, value) pairs, each where Kafka's default
    partitioner puts its key."""
    ensure_topic(settings, topic, 3, -1, create=True)
    produce(settings, topic, [(key.encode(), value.encode(), partition_for(key, 3)) for key, value in sent])


def _jobs(tmp_path: Path, example: str, broker, prefix: str, events: dict[str, int],
          batch_size: int) -> tuple[JobConfig, JobConfig]:
    """The example's generator job (fewer events) and its Kafka variant on ``broker``, with every
    topic named under ``prefix``; the Kafka input topics are filled with the generator's records."""
    folder = tmp_path / example
    shutil.copytree(EXAMPLES / example, folder)
    source = tomllib.loads((folder / "job.toml").read_text())
    for name, count in events.items():
        source["inputs"][name]["events"] = count
    source_job = parse_job_config(source, base_dir=folder, source=str(folder / "job.toml"))
    data = tomllib.loads((folder / "job_kafka.toml").read_text())
    assert data["job"]["changelog"] == "kafka"
    data["changelogs"]["kafka"].update(bootstrap_servers=broker.bootstrap_servers, topic_prefix=prefix)
    for section in ("inputs", "outputs"):
        for table in data[section].values():
            table["topic"] = prefix + table["topic"]
    data.setdefault("spark", {})["batch_size"] = batch_size
    kafka_job = parse_job_config(data, base_dir=folder, source=str(folder / "job_kafka.toml"))
    settings = _settings(broker.bootstrap_servers)
    for name in kafka_job.inputs:
        copied = copy_input_to_topic(source_job, name, settings, kafka_job.inputs[name].options["topic"])
        assert copied == events[name] * kafka_job.partitions
    return source_job, kafka_job


def _generated(job: JobConfig, stream: str, partition: int) -> list[tuple[int, Any, dict]]:
    o = job.inputs[stream].options
    return list(generate(o["kind"], o.get("seed", 7), job.partitions, partition, o.get("users", 10_000),
                         float(o.get("rate", 100.0)), float(o.get("start_ts", 1_700_000_000.0)), 0, o["events"]))


def _closed_hours(source: JobConfig, job: JobConfig) -> Counter:
    """Views per closed (user, hour) window of the generator's page views: what the job must emit."""
    expected: Counter = Counter()
    for partition in range(job.partitions):
        rows = _generated(source, "page_views", partition)
        last_hour = int(rows[-1][2]["ts"] // 3600)
        for _, user, value in rows:
            if int(value["ts"] // 3600) < last_hour:
                expected[(user, int(value["ts"] // 3600))] += 1
    return expected


def _output_records(job: JobConfig, name: str) -> list[tuple[int, Any, Any, dict[str, bytes]]]:
    """(topic partition, key, value, headers) of every record of a Kafka output, and a check
    that each sits in the partition murmur2 gives its key."""
    output = open_output(job, name)
    assert isinstance(output, KafkaOutput)
    count = output.topic_partitions()
    assert count == job.partitions  # created with the job's partition count
    rows = []
    for partition in range(count):
        for record in output.records(partition):
            key = output.key_serde.deserialize(record.key)
            assert partition_for(key, count) == partition, f"{key!r} is in partition {partition}"
            rows.append((partition, key, output.value_serde.deserialize(record.value), dict(record.headers)))
    return rows


def test_windowed_counts_on_kafka_exact(tmp_path, spark, kafka_broker, topic_prefix):
    source, job = _jobs(tmp_path, "windowed_counts", kafka_broker, topic_prefix, {"page_views": 6000}, 2500)
    summary = SparkJobRunner(job, context=spark.sparkContext, progress=None).run()
    assert summary.records_in == 2 * 6000 and summary.lag == 0 and len(summary.batches) == 3

    expected = _closed_hours(source, job)  # independent: closed (user, hour) windows from the generator
    records = _output_records(job, "hourly-counts")
    actual = {(user, value["hour"]): value["count"] for _, user, value, _ in records}
    assert len(actual) == len(records), "a window was emitted twice"
    assert expected and actual == expected
    # Every batch's transactions were committed by the driver: read_committed reads them all.
    assert sorted(map(repr, _committed_records(job, "hourly-counts"))) == sorted(map(repr, records))

    # Nothing left to do; running again changes nothing.
    assert SparkJobRunner(job, context=spark.sparkContext, progress=None).run().records_in == 0
    assert len(_output_records(job, "hourly-counts")) == len(records)
    # The stores' changelogs are (compacted) Kafka topics, one partition per job partition.
    settings = _settings(kafka_broker.bootstrap_servers)
    consumer = pooled_consumer(settings)
    try:
        ends = end_offsets(consumer, f"{topic_prefix}{job.name}-counts-changelog", range(job.partitions))
    finally:
        release_consumer(settings, consumer)
    assert len(ends) == 2 and all(end > 0 for end in ends.values())


def _committed_records(job: JobConfig, name: str) -> list[tuple[int, Any, Any, dict[str, bytes]]]:
    """:func:`_output_records` as a real Kafka read_committed consumer reads them (aborted
    transactions left out, see localstate.testing.kafka)."""
    output = open_output(job, name)
    assert isinstance(output, KafkaOutput)
    rows = []
    for partition in range(output.topic_partitions()):
        for record in read_committed(output.servers, output.topic, partition):
            rows.append((partition, output.key_serde.deserialize(record.key),
                         output.value_serde.deserialize(record.value), dict(record.headers)))
    return rows


def test_windowed_counts_on_kafka_exact_in_continuous_mode(tmp_path, spark, kafka_broker, topic_prefix):
    """Continuous mode follows Kafka input topics and writes Kafka outputs and changelogs: the same
    closed windows, each once, as the generator gives."""
    source, job = _jobs(tmp_path, "windowed_counts", kafka_broker, topic_prefix, {"page_views": 6000}, 2500)
    job = replace(job, spark={**job.spark, "mode": "continuous", "epoch": "1m"})
    summary = ContinuousRunner(job, context=spark.sparkContext, progress=None).run(until_drained=True)
    assert summary.records_in == 2 * 6000 and summary.records_out > 0
    expected = _closed_hours(source, job)
    records = _output_records(job, "hourly-counts")
    actual = {(user, value["hour"]): value["count"] for _, user, value, _ in records}
    assert len(actual) == len(records), "a window was emitted twice"
    assert expected and actual == expected
    assert sorted(map(repr, _committed_records(job, "hourly-counts"))) == sorted(map(repr, records))


def test_stream_table_join_on_kafka_exact(tmp_path, spark, kafka_broker, topic_prefix):
    source, job = _jobs(tmp_path, "stream_table_join", kafka_broker, topic_prefix,
                        {"page_views": 3000, "profiles": 600}, 1500)
    summary = SparkJobRunner(job, context=spark.sparkContext, progress=None).run()
    assert summary.records_in == 2 * 3600 and summary.lag == 0

    expected = []  # independent: page views joined with the latest earlier profile, in event time
    for partition in range(job.partitions):
        rows = [(v["ts"], index, offset, stream, k, v) for index, stream in enumerate(("page_views", "profiles"))
                for offset, k, v in _generated(source, stream, partition)]
        zips: dict[str, str] = {}
        for ts, _, _, stream, key, value in sorted(rows, key=lambda r: r[:3]):
            if stream == "profiles":
                zips[key] = value["zip"]
            else:
                expected.append((key, value["page"], ts, zips.get(key)))
    actual = [(k, v["page"], v["ts"], v["zip"]) for _, k, v, _ in _output_records(job, "enriched-views")]
    assert len(actual) == 2 * 3000
    assert Counter(actual) == Counter(expected)
    assert any(z is None for *_, z in expected) and any(z for *_, z in expected)


def _count_job(tmp_path: Path, broker, prefix: str, on_error: str, servers: str | None = None,
               partitions: int = 2, transactions: bool = True) -> JobConfig:
    """tests/spark/count_task.py's CountByKey: Kafka input ``events``, Kafka output ``counts-out``."""
    servers = servers or broker.bootstrap_servers
    return parse_job_config({
        "job": {"name": "kafka-counts", "partitions": partitions, "task": "count_task:CountByKey",
                "state_dir": "state", "pythonpath": [str(ROOT / "tests" / "spark")]},
        "inputs": {"events": {"system": "kafka", "bootstrap_servers": servers, "topic": prefix + "events",
                              "on_error": on_error, "connect_timeout": "1s"}},
        "outputs": {"counts-out": {"system": "kafka", "bootstrap_servers": servers, "topic": prefix + "counts",
                                   "value_serde": "int", "transactions": transactions}},
        "stores": {"counts": {"engine": "kv", "backend": "memory", "key_serde": "string", "value_serde": "int",
                              "changelog": False}},
    }, base_dir=tmp_path, source=str(tmp_path / "job.toml"))


@pytest.mark.parametrize("transactions", [False, True])
def test_failed_batch_redelivers_outputs_with_the_same_headers(tmp_path, spark, kafka_broker, topic_prefix,
                                                               transactions):
    """Partition 1 meets an undecodable record (on_error = fail): the batch fails after partition 0
    flushed its outputs. With on_error = skip the rerun delivers partition 0's outputs again. Without
    transactions Kafka outputs are at-least-once, and (producer, seq) identifies each duplicate
    exactly; with them, the failed batch's transaction is aborted when partition 0 reopens and a
    read_committed reader (the reference one: Tansu shows aborted records) reads each record once."""
    settings = _settings(kafka_broker.bootstrap_servers)
    topic = topic_prefix + "events"
    assert ensure_topic(settings, topic, 2, -1, create=True) == 2
    keys = {p: [k for k in (f"key-{i}" for i in range(40)) if partition_for(k, 2) == p] for p in (0, 1)}
    records = [(keys[p][i % len(keys[p])].encode(), json.dumps({"i": i}).encode(), p)
               for p in (0, 1) for i in range(300)]
    records.insert(310, (keys[1][0].encode(), b"{not json", 1))  # partition 1, offset 10
    produce(settings, topic, records)

    with pytest.raises(InputError) as failed:
        SparkJobRunner(_count_job(tmp_path, kafka_broker, topic_prefix, "fail", transactions=transactions),
                       context=spark.sparkContext, progress=None).run()
    assert failed.value.context["stream"] == "events" and failed.value.context["offset"] == 10
    job = _count_job(tmp_path, kafka_broker, topic_prefix, "skip", transactions=transactions)
    summary = SparkJobRunner(job, context=spark.sparkContext, progress=None).run()
    assert sum(b.skipped for b in summary.batches) == 1 and summary.lag == 0

    rows = _output_records(job, "counts-out") if not transactions else _committed_records(job, "counts-out")
    by_seq: dict[tuple[bytes, int], tuple[str, int]] = {}
    for _, key, value, headers in rows:
        ident = (headers[PRODUCER_HEADER], int(headers[SEQ_HEADER]))
        assert by_seq.setdefault(ident, (key, value)) == (key, value), "a duplicate differs from its original"
    expected = Counter()
    for p in (0, 1):
        seen: Counter = Counter()
        for i in range(300):
            key = keys[p][i % len(keys[p])]
            seen[key] += 1
            expected[(key, seen[key])] += 1
    assert Counter(by_seq.values()) == expected  # exact once deduplicated
    duplicates = len(rows) - len(by_seq)
    assert duplicates == (0 if transactions else 300)  # partition 0's outputs of the failed batch
    assert {producer for producer, _ in by_seq} == {b"kafka-counts/0", b"kafka-counts/1"}


def test_unreachable_broker_fails_fast_naming_the_servers(tmp_path, spark, kafka_broker, topic_prefix):
    servers = f"127.0.0.1:{free_port()}"  # nothing listens there
    job = _count_job(tmp_path, kafka_broker, topic_prefix, "fail", servers=servers)
    with pytest.raises(InputError) as error:
        SparkJobRunner(job, context=spark.sparkContext, progress=None).run()
    assert servers in str(error.value) and error.value.context["bootstrap_servers"] == servers
    assert error.value.context["stream"] == "events" and error.value.hint


def test_wrong_partition_count_or_missing_topic_is_a_clear_error(tmp_path, spark, kafka_broker, topic_prefix):
    job = _count_job(tmp_path, kafka_broker, topic_prefix, "fail", partitions=3)
    with pytest.raises(InputError, match="does not exist") as missing:
        SparkJobRunner(job, context=spark.sparkContext, progress=None).run()
    assert "3 partition(s)" in missing.value.hint
    assert ensure_topic(_settings(kafka_broker.bootstrap_servers), topic_prefix + "events", 2, -1, create=True) == 2
    with pytest.raises(InputError, match="has 2 partition.* but the job has 3") as wrong:
        SparkJobRunner(job, context=spark.sparkContext, progress=None).run()
    assert "partitions = 2" in wrong.value.hint and wrong.value.context["topic"] == topic_prefix + "events"


def test_output_delivery_to_a_frozen_broker_fails_within_its_timeout(tmp_path, private_broker, topic_prefix):
    """SIGSTOP the broker: a commit's output flush fails with an OutputError naming the servers
    after delivery_timeout (no hang); after SIGCONT the next attempt delivers."""
    servers = private_broker.bootstrap_servers
    job = parse_job_config({
        "job": {"name": "frozen", "partitions": 1, "task": "m:C"},
        "outputs": {"out": {"system": "kafka", "bootstrap_servers": servers, "topic": topic_prefix + "out",
                            "delivery_timeout": "1s"}}}, base_dir=tmp_path)
    output = open_output(job, "out")
    assert output.truncate(0, 0) == 0 and output.append(0, [("a", 1)]) == 1
    private_broker.pause()
    try:
        with pytest.raises(OutputError) as error:
            output.append(0, [("b", 2)])
    finally:
        private_broker.resume()
    assert servers in str(error.value) and error.value.context["topic"] == topic_prefix + "out"
    assert output.truncate(0, 1) == 1  # what the retried attempt does: back to the checkpointed count
    assert output.append(0, [("b", 2)]) == 2
    assert set(output.read(0)) == {("a", 1), ("b", 2)}  # "b" may be there twice: at-least-once


def test_end_offsets_are_exact_despite_list_offsets(kafka_broker, topic_prefix):
    """Tansu's ListOffsets(latest) answers the last batch's base offset + 1; the planner must
    still find every record (else the end of a run would leave records unread)."""
    settings = _settings(kafka_broker.bootstrap_servers)
    topic = topic_prefix + "ends"
    ensure_topic(settings, topic, 3, -1, create=True)
    produce(settings, topic, [(b"k", b"v", i % 2) for i in range(1000)], linger=0.05)  # big batches
    consumer = pooled_consumer(settings)
    try:
        assert end_offsets(consumer, topic, [0, 1, 2]) == {0: 500, 1: 500, 2: 0}
        assert end_offsets(consumer, topic, [0, 1, 2], {0: 500, 1: 10}) == {0: 500, 1: 500, 2: 0}
    finally:
        release_consumer(settings, consumer)


def test_data_source_reads_partition_p_as_spark_partition_p_and_writes_by_murmur2(spark, kafka_broker,
                                                                                  topic_prefix):
    from pyspark.sql.functions import spark_partition_id

    servers = kafka_broker.bootstrap_servers
    settings = _settings(servers)
    topic = topic_prefix + "source"
    sent = [(f"user-{i % 17}", f"view-{i}") for i in range(600)]
    _keyed_topic(settings, topic, sent)

    reader = spark.read.format("localstate-kafka").option("bootstrap_servers", servers).option("topic", topic)
    rows = reader.option("partitions", 3).load().select("*", spark_partition_id().alias("spark_partition")).collect()
    assert all(r.partition == r.spark_partition for r in rows)
    assert Counter((r.key.decode(), r.value.decode()) for r in rows) == Counter(sent)
    assert all(partition_for(r.key, 3) == r.partition for r in rows)
    ranged = reader.option("startingOffsets", '{"0": 5}').option("endingOffsets", '{"0": 9, "1": 0, "2": 0}').load()
    assert sorted((r.partition, r.offset) for r in ranged.collect()) == [(0, o) for o in range(5, 9)]

    target = topic_prefix + "sink"
    rows_out = spark.createDataFrame([(f"k{i}", f"v{i}") for i in range(200)] + [(None, "no-key")],
                                     "key string, value string")
    (rows_out.repartition(2).write.format("localstate-kafka").option("bootstrap_servers", servers)
     .option("topic", target).option("create", "true").option("partitions", 4).mode("append").save())
    written = []  # read back with kafka-python directly, independently of the Data Source
    consumer = pooled_consumer(settings)
    try:
        ends = end_offsets(consumer, target, range(4))
    finally:
        release_consumer(settings, consumer)
    for partition in range(4):
        written += [(partition, r.key, r.value) for r in read_records(settings, target, partition, 0, ends[partition])]
    assert Counter((k.decode() if k else None, v.decode()) for _, k, v in written) == \
        Counter([(f"k{i}", f"v{i}") for i in range(200)] + [(None, "no-key")])
    assert all(partition_for(k, 4) == p for p, k, _ in written if k is not None)


def test_data_source_reads_every_record_as_kafka_python_gives_it(spark, kafka_broker, topic_prefix, monkeypatch):
    """The source's rows are Arrow batches of at most READ_BATCH_ROWS records: differential against
    kafka-python's records read directly (the reference), field by field, keys absent and present,
    across batch boundaries; through Spark, each row's timestamp is its record's."""
    from datetime import datetime, timezone

    from localstate.runtime.spark import kafka_source

    servers = kafka_broker.bootstrap_servers
    settings = _settings(servers)
    topic = topic_prefix + "fields"
    ensure_topic(settings, topic, 2, -1, create=True)
    produce(settings, topic, [(None if i % 5 == 0 else b"k-%d" % i, b"v-%d" % i, i % 2) for i in range(53)])
    reference = {(p, r.offset): (r.key, r.value, r.timestamp) for p in (0, 1)
                 for r in read_records(settings, topic, p, 0, 27 if p == 0 else 26)}
    assert len(reference) == 53

    monkeypatch.setattr(kafka_source, "READ_BATCH_ROWS", 7)
    config = kafka_source._Config.parse({"bootstrap_servers": servers, "topic": topic})
    read = {}
    for p, count in ((0, 27), (1, 26)):
        batches = list(kafka_source._read(config, kafka_source.KafkaRangePartition(p, 2, count)))
        assert [b.num_rows for b in batches] == [7] * ((count - 2) // 7) + ([(count - 2) % 7] if (count - 2) % 7 else [])
        assert all(b.schema == kafka_source._arrow_schema() for b in batches)
        for row in (r for b in batches for r in b.to_pylist()):
            assert row["topic"] == topic and row["partition"] == p
            read[(p, row["offset"])] = (row["key"], row["value"], row["timestamp"])
    assert read.keys() == {key for key in reference if key[1] >= 2}
    for key, (k, v, at) in read.items():
        assert (k, v) == reference[key][:2]
        assert at == datetime.fromtimestamp(reference[key][2] / 1000, tz=timezone.utc)

    rows = spark.read.format("localstate-kafka").option("bootstrap_servers", servers).option("topic", topic).load() \
        .selectExpr("partition", "offset", "key", "value", "CAST(unix_micros(timestamp) AS BIGINT) AS micros").collect()
    assert {(r.partition, r.offset): (r.key, r.value, r.micros // 1000) for r in rows} == reference


def test_data_source_streaming_read_resumes_from_its_checkpoint(tmp_path, spark, kafka_broker, topic_prefix):
    servers = kafka_broker.bootstrap_servers
    settings = _settings(servers)
    topic = topic_prefix + "stream"
    ensure_topic(settings, topic, 2, -1, create=True)

    def drain() -> list[Any]:
        """Run the query until it has read what is there now; return every row its sink holds."""
        stream = (spark.readStream.format("localstate-kafka").option("bootstrap_servers", servers)
                  .option("topic", topic).load())
        query = (stream.writeStream.format("parquet").option("path", str(tmp_path / "rows"))
                 .option("checkpointLocation", str(tmp_path / "checkpoint")).trigger(availableNow=True).start())
        query.awaitTermination()
        assert query.exception() is None
        return spark.read.parquet(str(tmp_path / "rows")).select("partition", "offset", "value").collect()

    produce(settings, topic, [(b"a", b"first-%d" % i, i % 2) for i in range(100)])
    first = drain()
    assert sorted(r.value for r in first) == sorted(b"first-%d" % i for i in range(100))
    produce(settings, topic, [(b"b", b"second-%d" % i, i % 2) for i in range(50)])
    both = drain()  # the same checkpoint: the new records, each once
    assert sorted(r.value for r in both) == sorted([b"first-%d" % i for i in range(100)] +
                                                   [b"second-%d" % i for i in range(50)])
    assert sorted((r.partition, r.offset) for r in both) == [(p, o) for p in (0, 1) for o in range(75)]


def test_data_source_streaming_read_limits_each_micro_batch(tmp_path, spark, kafka_broker, topic_prefix):
    """``max_records_per_trigger``: availableNow reads what is there in micro-batches of at most that
    many records, each record exactly once."""
    servers = kafka_broker.bootstrap_servers
    settings = _settings(servers)
    topic = topic_prefix + "limited"
    ensure_topic(settings, topic, 2, -1, create=True)
    produce(settings, topic, [(b"k", b"v-%d" % i, i % 2) for i in range(100)])
    stream = (spark.readStream.format("localstate-kafka").option("bootstrap_servers", servers)
              .option("topic", topic).option("max_records_per_trigger", 30).load())
    query = (stream.writeStream.format("parquet").option("path", str(tmp_path / "rows"))
             .option("checkpointLocation", str(tmp_path / "checkpoint")).trigger(availableNow=True).start())
    query.awaitTermination()
    assert query.exception() is None
    sizes = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
    assert sizes == [30, 30, 30, 10]
    rows = spark.read.parquet(str(tmp_path / "rows")).select("value").collect()
    assert sorted(r.value for r in rows) == sorted(b"v-%d" % i for i in range(100))


# The batch task on input partitioned by key runs in the default run on local DataFrames
# (tests/spark/test_dataframe_partitioned.py); on Kafka it is the slow soak.
@pytest.mark.parametrize("task", ["CountAndRank", pytest.param("CountAndRankBatch", marks=pytest.mark.slow)])
def test_dataframe_step_on_the_kafka_source_exact_partitioned_by_key_or_shuffled(tmp_path, spark, kafka_broker,
                                                                                  topic_prefix, task):
    """``foreach_batch`` over the ``localstate-kafka`` streaming source, whose topic is placed by
    Kafka's partitioner with the job's partition count: told the input is partitioned by key
    (``partitioned=True``: one stage, no shuffle) and not (shuffled by key), in several micro-batches.
    Both give the state and the outputs of a plain-Python count over the topic, per key in offset
    order."""
    import sys

    sys.path.insert(0, str(ROOT / "tests" / "spark"))  # the tasks module, as the Python workers import it
    from dataframe_tasks import job_config, read_state

    from localstate.spark import foreach_batch, release

    servers = kafka_broker.bootstrap_servers
    settings = _settings(servers)
    topic = topic_prefix + "dataframe-step"
    sent = [(f"user-{(i * 7) % 37}", f"/p/{i}") for i in range(400)]
    _keyed_topic(settings, topic, sent)
    counts: Counter[str] = Counter()
    expected = []
    for key, page in sent:  # a key lives in one topic partition: its records come in the order sent
        counts[key] += 1
        expected.append((key, counts[key], page))
    for partitioned in (True, False):
        job = job_config(tmp_path / f"state-{partitioned}", partitions=3, task=f"dataframe_tasks:{task}")
        rows: list[tuple[str, int, str]] = []
        reports: list[Any] = []

        def sink(outputs: Any, batch_id: int) -> None:
            rows.extend((json.loads(r.key), *json.loads(r.value)[:2]) for r in outputs.collect())

        stream = (spark.readStream.format("localstate-kafka").option("bootstrap_servers", servers)
                  .option("topic", topic).option("max_records_per_trigger", 90).load()
                  .selectExpr("CAST(key AS STRING) AS user", "CAST(value AS STRING) AS page", "offset"))
        query = (stream.writeStream.foreachBatch(foreach_batch(job, key="user", sink=sink, partitioned=partitioned,
                                                               progress=reports.append))
                 .option("checkpointLocation", str(tmp_path / f"query-{partitioned}")).trigger(availableNow=True)
                 .start())
        query.awaitTermination()
        assert query.exception() is None
        release(job)
        assert len(reports) >= 4 and sum(r.records for r in reports) == len(sent)
        assert sorted(rows) == sorted(expected), partitioned
        assert read_state(job)[0] == dict(counts), partitioned
