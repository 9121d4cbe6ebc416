"""The state reader on a job run through the DataFrame entry point: ``batchId`` reads exactly the state
after that micro-batch (the last one, or an older one from a copy of the checkpoints), and refuses a
batch the checkpoints do not hold; the checkpoints view shows each partition's batch id."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

import localstate.spark
from localstate.core.config import load_job_config
from localstate.spark import run_batch
from localstate.errors import StateNotFoundError

pytestmark = pytest.mark.spark

HERE = Path(__file__).resolve().parent

JOB = """
[job]
name = "df-reader"
partitions = 3
task = "dataframe_tasks:CountAndRank"
state_dir = "state"
pythonpath = ["{tests}"]

[stores.counts]
engine = "kv"
backend = "rocksdb"
key_serde = "string"
value_serde = "int"

[stores.top]
engine = "heap"
key_serde = "string"
value_serde = "json"
order = "max"
"""

BATCHES = [[{"user": f"user-{(i * 7 + b) % 23}", "page": f"/p/{i % 5}", "ts": b * 1000 + i} for i in range(120)]
           for b in range(2)]


def counts_after(batches: int) -> dict[str, int]:
    """Plain Python: rows per user over the first ``batches`` batches."""
    counts: dict[str, int] = {}
    for batch in BATCHES[:batches]:
        for row in batch:
            counts[row["user"]] = counts.get(row["user"], 0) + 1
    return counts


def test_batch_id_reads_the_state_after_that_batch(spark_context, tmp_path):
    from pyspark.sql import SparkSession

    spark = SparkSession(spark_context)
    job_file = tmp_path / "job.toml"
    job_file.write_text(JOB.format(tests=HERE))
    job = load_job_config(job_file)
    sys.path.insert(0, str(HERE))  # dataframe_tasks, as the job's pythonpath gives it to the workers
    try:
        for batch_id, batch in enumerate(BATCHES):
            run_batch(spark.createDataFrame(batch, "user string, page string, ts long"), str(job_file), key="user",
                      order_by="ts", batch_id=batch_id)
            if batch_id == 0:
                shutil.copytree(job.state_dir / job.name / "checkpoints", tmp_path / "after-0",
                                ignore=shutil.ignore_patterns("*.lock"))
    finally:
        sys.path.remove(str(HERE))

    def counts(**options) -> dict[str, int]:
        rows = localstate.spark.read_state(spark, job_file, store="counts", **options).collect()
        return {r["key"]: r["value"] for r in rows}

    assert counts() == counts(batchId=1) == counts_after(2)
    assert counts(batchId=0, checkpointDir=tmp_path / "after-0") == counts_after(1)
    with pytest.raises(StateNotFoundError, match="state after batch 1, not after batch 0"):
        counts(batchId=0)
    with pytest.raises(StateNotFoundError, match="state after batch 1, not after batch 2"):
        counts(batchId=2)
    view = localstate.spark.read_state(spark, job_file, view="checkpoints").collect()
    assert sorted(r["partition"] for r in view) == [0, 1, 2]
    assert {r["batch_id"] for r in view if r["committed"]} == {1}
