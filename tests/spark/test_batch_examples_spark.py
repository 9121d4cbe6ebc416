"""The batch-task examples on both Spark paths (issue #35): the stream-table join and the counting
example, each run as its per-record task and as its batch task on the native path (a jsonl input
read as columns; two generator inputs merged in event time) and on the DataFrame step; the same
state and outputs, partition by partition, in order."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path
from typing import Any

import pytest

from localstate.core.config import load_job_config, parse_job_config
from localstate.runtime.layout import open_changelog_system
from localstate.core.partitioner import partition_for
from localstate.core.stream import open_output
from localstate.runtime.partition.instance import TaskInstance
from localstate.runtime.spark.runner import SparkJobRunner
from localstate.spark import run_batch

from .test_spark_runtime import EXAMPLES

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def spark(spark_context):
    from pyspark.sql import SparkSession

    return SparkSession(spark_context)


def _state(job: Any, store: str) -> list[list[tuple[Any, Any]]]:
    """Each partition's committed contents of ``store``, read by opening the partition."""
    changelogs = open_changelog_system(job)
    try:
        contents = []
        for partition in range(job.partitions):
            instance = TaskInstance(job, partition, changelogs)
            instance.open()
            try:
                with instance.stores[store].engine.all() as items:
                    contents.append(list(items))
            finally:
                instance.close(commit=False)
        return contents
    finally:
        changelogs.close()


def _outputs(job: Any, name: str) -> list[list[tuple[Any, Any]]]:
    output = open_output(job, name)
    try:
        return [list(output.read(p)) for p in range(job.partitions)]
    finally:
        output.close()


def _native(tmp_path: Path, spark_context: Any, source: Path, task: str, batch_size: int) -> Any:
    target = tmp_path / task.replace(":", "-")
    shutil.copytree(source, target, ignore=shutil.ignore_patterns(".work", "__pycache__"))
    text = (target / "job.toml").read_text()
    task_line = next(line for line in text.splitlines() if line.startswith("task = "))
    (target / "job.toml").write_text(text.replace(task_line, f'task = "{task}"'))
    job = load_job_config(target / "job.toml")
    summary = SparkJobRunner(job, context=spark_context, batch_size=batch_size, progress=None).run()
    assert summary.lag == 0 and len(summary.batches) > 1
    return job


def test_stream_table_join_native_path(tmp_path, spark_context):
    source = EXAMPLES / "stream_table_join"
    runs = [_native(tmp_path, spark_context, source, f"stream_table_join:{task}", 4000)
            for task in ("EnrichWithZip", "EnrichWithZipBatch")]
    per_record, batched = ((_state(job, "profiles"), _outputs(job, "enriched-views")) for job in runs)
    assert batched == per_record
    assert sum(map(len, per_record[1])) == 2 * 15000


def _counting_job(directory: Path, rows: int) -> None:
    """The counting example's task over a jsonl input of ``{"value": n}`` values (read as columns by
    the batch task), with a few undecodable lines for on_error."""
    directory.mkdir()
    shutil.copy(EXAMPLES / "dataframe" / "counting.py", directory / "counting.py")
    rng = random.Random(11)
    for partition in range(2):
        lines = []
        for i in range(rows):
            if i % 1999 == 1000:
                lines.append('{"key":"u1","value":NaN}')
                continue
            user = "u0" if rng.random() < 0.4 else f"u{rng.randrange(1, 60)}"
            while partition_for(user, 2) != partition:  # an input partitioned by key, as a job needs
                user = f"u{rng.randrange(1, 60)}"
            lines.append(json.dumps({"key": user, "value": {"value": rng.randrange(100)}, "ts": 1_700_000_000 + i}))
        (directory / "data").mkdir(exist_ok=True)
        (directory / "data" / f"{partition}.jsonl").write_text("\n".join(lines) + "\n")
    (directory / "job.toml").write_text("""
[job]
name = "counting"
partitions = 2
task = "counting:CountPerUser"
state_dir = "state"
pythonpath = ["."]

[inputs.events]
system = "jsonl"
path = "data"
on_error = "dead_letter"
dead_letter = "dead"

[outputs.counts]
system = "jsonl"
path = "out"

[outputs.dead]
system = "jsonl"
path = "dead"

[stores.counts]
engine = "kv"
key_serde = "string"
value_serde = "int"
""")


def test_counting_native_path_reads_columns(tmp_path, spark_context):
    _counting_job(tmp_path / "source", 9000)
    runs = [_native(tmp_path, spark_context, tmp_path / "source", f"counting:{task}", 5000)
            for task in ("CountPerUser", "CountPerUserBatch")]
    per_record, batched = ((_state(job, "counts"), _outputs(job, "counts"), _outputs(job, "dead")) for job in runs)
    assert batched == per_record
    assert sum(count for part in per_record[0] for _, count in part) == 2 * (9000 - 5)
    assert sum(map(len, per_record[2])) == 2 * 5


def _df_job(tmp_path: Path, name: str, task: str, stores: dict[str, Any], module: Path) -> Any:
    return parse_job_config({"job": {"name": name, "partitions": 3, "task": task, "state_dir": str(tmp_path / name),
                                     "pythonpath": [str(module)]}, "stores": stores}, base_dir=tmp_path)


def _df_rows(out: Any) -> list[tuple[Any, ...]]:
    return sorted((r.partition, r.batch_id, r.seq, r.stream, r.key, r.value) for r in out.collect())


def test_counting_dataframe_step(spark, tmp_path):
    stores = {"counts": {"engine": "kv", "key_serde": "string", "value_serde": "int"}}
    rng = random.Random(5)
    batches = [[{"user": "u0" if rng.random() < 0.4 else f"u{rng.randrange(30)}", "value": rng.randrange(50),
                 "ts": rng.randrange(10 ** 6)} for _ in range(size)] for size in (300, 120, 250)]
    results = []
    for task in ("CountPerUser", "CountPerUserBatch"):
        job = _df_job(tmp_path, task, f"counting:{task}", stores, EXAMPLES / "dataframe")
        outputs = [_df_rows(run_batch(spark.createDataFrame(batch, "user string, value long, ts long").repartition(3),
                                      job, key="user", order_by="ts", batch_id=i))
                   for i, batch in enumerate(batches)]
        results.append((_state(job, "counts"), outputs))
    assert results[1] == results[0]
    assert sum(count for part in results[0][0] for _, count in part) == sum(map(len, batches))


def test_stream_table_join_dataframe_step(spark, tmp_path):
    """Profiles and page views as alternating micro-batches of two streams (``stream=``)."""
    stores = {"profiles": {"engine": "kv", "key_serde": "string", "value_serde": "json"}}
    rng = random.Random(8)
    steps = []
    for i in range(4):
        users = [f"u{rng.randrange(25)}" for _ in range(60)]
        steps.append(("profiles", "user string, zip string, ts long",
                      [{"user": u, "zip": str(10000 + rng.randrange(90)), "ts": 1000 * i + j} for j, u in enumerate(users)]))
        steps.append(("page_views", "user string, page string, ts long",
                      [{"user": f"u{rng.randrange(30)}", "page": f"/p{rng.randrange(5)}", "ts": 1000 * i + 500 + j}
                       for j in range(150)]))
    results = []
    for task in ("EnrichWithZip", "EnrichWithZipBatch"):
        job = _df_job(tmp_path, task, f"stream_table_join:{task}", stores, EXAMPLES / "stream_table_join")
        outputs = [_df_rows(run_batch(spark.createDataFrame(rows, schema).repartition(3), job, key="user",
                                      order_by="ts", stream=stream, batch_id=i))
                   for i, (stream, schema, rows) in enumerate(steps)]
        results.append((_state(job, "profiles"), outputs))
    assert results[1] == results[0]
    enriched = [json.loads(row[5]) for out in results[0][1] for row in out if row[3] == "enriched-views"]
    assert len(enriched) == 4 * 150 and any(e["zip"] for e in enriched) and any(e["zip"] is None for e in enriched)
