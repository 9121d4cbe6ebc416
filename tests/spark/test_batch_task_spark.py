"""BatchTask on both Spark paths: the native input path (the plan's records built into Arrow batches
in chunks, bad rows under on_error per row) and the DataFrame step (Arrow end to end): the same state
and outputs as the per-record task."""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the tasks modules, as the Python workers import them
from counting_job import final_counts  # tests/ is on sys.path (tests/conftest.py)
from dataframe_tasks import expected_outputs, job_config, read_state
from localstate.core.config import load_job_config
from localstate.core.stream import open_output
from localstate.runtime.spark.runner import SparkJobRunner
from localstate.spark import run_batch

from .test_dataframe_batch import SCHEMA, _batches, _rows
from .test_spark_runtime import _bad_input_job

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def spark(spark_context):
    from pyspark.sql import SparkSession

    return SparkSession(spark_context)


def test_native_path_batch_task_with_bad_rows(tmp_path, spark_context):
    path = _bad_input_job(tmp_path, "dead_letter")
    path.write_text(path.read_text().replace("count_task:CountByKey", "count_task:CountByKeyBatch"))
    job = load_job_config(path)
    summary = SparkJobRunner(job, context=spark_context, batch_size=9, progress=None).run()
    assert summary.records_in == 62
    assert sum(b.dead_lettered for b in summary.batches) == 2
    assert final_counts(job) == dict(Counter(f"k{i % 7}" for i in range(60)))
    output = open_output(job, "counts-out")
    for partition in range(2):   # running counts in input order, across batches and chunks
        seen: dict = {}
        for key, count in output.read(partition):
            assert count == seen.get(key, 0) + 1
            seen[key] = count
    dead = [v for p in range(2) for _, v in open_output(job, "dead").read(p)]
    assert [(d["partition"], d["offset"]) for d in dead] == [(1, 3), (1, 5)]


def test_dataframe_step_batch_task_matches_the_per_record_task(spark, tmp_path):
    job = job_config(tmp_path / "state", partitions=3, task="dataframe_tasks:CountAndRankBatch")
    batches = _batches(7, [200, 150])
    outputs = []
    for batch_id, batch in enumerate(batches):
        df = spark.createDataFrame(batch, SCHEMA).repartition(3)
        outputs.append(sorted(run_batch(df, job, key="user", order_by="ts", batch_id=batch_id).collect()))
    counts, expected_rows = expected_outputs(batches)
    assert sorted(r for out in outputs for r in _rows(spark.createDataFrame(out, "partition int, batch_id long, "
                                                                             "seq long, stream string, key string, "
                                                                             "value string"))) == sorted(expected_rows)
    state_counts, scores = read_state(job)
    assert state_counts == counts
    assert scores == {user: float(count) for user, count in counts.items()}
    for out in outputs:   # within a partition, outputs follow the order column
        by_partition: dict[int, list] = {}
        for row in sorted(out, key=lambda r: (r.partition, r.seq)):
            by_partition.setdefault(row.partition, []).append(json.loads(row.value)[2])
        assert all(ts == sorted(ts) for ts in by_partition.values())


def test_native_path_batch_task_survives_a_killed_worker(tmp_path, spark_context):
    """A Python worker SIGKILLed in the middle of a batch task's batch: Spark retries the task, the
    partition recovers to its checkpoint and the whole batch is delivered again; counts stay exact."""
    from .test_batch_overhead import _counting_job, _exactly_once, _expected

    path = _counting_job(tmp_path, "killed-batch")
    path.write_text(path.read_text().replace("count_task:CountByKey", "count_task:CountByKeyBatch"))
    job = load_job_config(path)
    marker = tmp_path / "killed-once"
    fault = {"partition": 0, "batch": 1, "after": 3, "marker": str(marker)}
    summary = SparkJobRunner(job, context=spark_context, batch_size=10, fault=fault, progress=None).run()
    assert marker.exists(), "the worker of partition 0 should have been SIGKILLed in batch 1"
    assert [b.failed_attempts for b in summary.batches] == [0, 1, 0, 0]
    assert _exactly_once(job) == _expected(tmp_path)


def test_dataframe_rows_become_one_arrow_batch(tmp_path):
    """The DataFrame step's batch, built from the Arrow rows (no Spark needed): value column or a
    struct of all columns, the order column as seconds, offsets from the partition's position."""
    import datetime

    import pyarrow as pa

    from localstate.runtime.spark.dataframe import DataFrameSpec, _arrow_rows

    job = job_config(tmp_path / "state")
    when = [datetime.datetime(2026, 1, 1, 0, 0, s) for s in (1, 2)]
    table = pa.table({"user": ["a", "b"], "page": ["/x", None], "at": pa.array(when, pa.timestamp("us"))})
    [rows] = _arrow_rows(DataFrameSpec(job, key="user", order_by="at", columns=("user", "page", "at"),
                                       ts="timestamp"), table, 7)
    batch = rows.batch
    assert rows.stream == "dataframe" and rows.start == 7
    assert batch.schema.names == ["key", "value", "timestamp", "offset"]
    assert batch.column("offset").to_pylist() == [7, 8]
    assert batch.column("value").field("page").to_pylist() == ["/x", None]
    epoch = datetime.datetime(2026, 1, 1, tzinfo=datetime.timezone.utc).timestamp()
    assert batch.column("timestamp").to_pylist() == [epoch + 1, epoch + 2]
    [rows] = _arrow_rows(DataFrameSpec(job, key="user", value="page", columns=("user", "page", "at")), table, 0)
    assert rows.batch.column("value").to_pylist() == ["/x", None]
    assert rows.batch.column("timestamp").null_count == 2
    assert _arrow_rows(DataFrameSpec(job, key="user", columns=("user",)), table.slice(0, 0), 0) == []
