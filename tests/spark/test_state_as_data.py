"""State as data on Spark, end to end: a job run by ``localstate run``'s runner, drained, saved,
rescaled to another partition count and run on over its inputs laid out for it equals a plain-Python
model; a savepoint read with ``spark.read.format("localstate").option("savepoint", ...)`` is the
job's state as the live reader shows it; a bootstrap from a DataFrame, then a stream run on top,
equals the model; a job with state is not bootstrapped over without overwrite."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

import localstate.spark
from localstate.core.config import load_job_config
from localstate.core.partitioner import partition_for
from localstate.errors import StateExistsError
from localstate.runtime.layout import resolve_epoch
from localstate.runtime.spark.runner import SparkJobRunner
from localstate.runtime.statedata.location import SavepointLocation
from localstate.runtime.statedata.rescale import rescale
from localstate.runtime.statedata.writer import take_savepoint
from localstate.streams.jsonl import write_jsonl

pytestmark = pytest.mark.spark

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "core"))
from count_and_remember import stores_toml  # noqa: E402 - tests/core: the job's task and its stores

USERS = [f"user-{i:02d}" for i in range(23)]

JOB = """
[job]
name = "sad"
partitions = {partitions}
task = "count_and_remember:CountAndRemember"
state_dir = "state"

[inputs.views]
system = "jsonl"
path = "{inputs}"

""" + stores_toml(top_order=False, scratch=False)


def job_file(root: Path, partitions: int, inputs: str) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "job.toml").write_text(JOB.format(partitions=partitions, inputs=inputs))
    shutil.copy(HERE.parent / "core" / "count_and_remember.py", root)
    return root / "job.toml"


def lay_out(directory: Path, records: list[tuple[str, str]], partitions: int) -> None:
    """``records`` as a jsonl input laid out for ``partitions`` partitions (by localstate's partitioner)."""
    for p in range(partitions):
        write_jsonl(directory, p, [{"key": k, "value": v} for k, v in records if partition_for(k, partitions) == p])


def model(records: list[tuple[str, str]], start: dict[str, int] | None = None) -> dict[str, int]:
    counts = dict(start or {})
    for key, _ in records:
        counts[key] = counts.get(key, 0) + 1
    return counts


def counts_of(spark, job: Path) -> dict[str, int]:
    rows = localstate.spark.read_state(spark, str(job), store="counts").collect()
    return {row.key: row.value for row in rows}


@pytest.fixture(scope="module")
def spark(spark_context):
    from pyspark.sql import SparkSession

    session = SparkSession(spark_context)
    localstate.spark.register(session)
    return session


def test_run_drain_savepoint_rescale_and_run_on_equals_the_model(spark, spark_context, tmp_path: Path) -> None:
    first = [(USERS[i % 23], f"/p{i % 5}") for i in range(300)]
    second = [(USERS[(i * 7) % 23], f"/q{i % 3}") for i in range(200)]
    lay_out(tmp_path / "in-3", first, 3)
    job = load_job_config(job_file(tmp_path, 3, "in-3"))
    SparkJobRunner(job, context=spark_context, batch_size=50, progress=None).run(until_drained=True)
    assert counts_of(spark, tmp_path / "job.toml") == model(first)

    # a savepoint, read back through Spark like the live job
    take_savepoint(resolve_epoch(job), SavepointLocation({"url": str(tmp_path / "sp")}))
    saved = localstate.spark.read_savepoint(spark, str(tmp_path / "sp"), store="counts").collect()
    live = localstate.spark.read_state(spark, str(tmp_path / "job.toml"), store="counts").collect()
    assert sorted(map(tuple, saved)) == sorted(map(tuple, live))
    top = localstate.spark.read_savepoint(spark, str(tmp_path / "sp"), store="top").collect()
    assert {row.item: row.score for row in top} == {k: float(v) for k, v in model(first).items()}

    # rescale 3 -> 5, then the job file says 5 and reads the input laid out for 5 partitions
    rescale(resolve_epoch(job), 5)
    lay_out(tmp_path / "in-5", second, 5)
    rescaled = load_job_config(job_file(tmp_path, 5, "in-5"))
    SparkJobRunner(rescaled, context=spark_context, batch_size=50, progress=None).run(until_drained=True)
    assert counts_of(spark, tmp_path / "job.toml") == model(second, model(first))
    rows = localstate.spark.read_state(spark, str(tmp_path / "job.toml"), store="counts").collect()
    assert all(partition_for(row.key, 5) == row.partition for row in rows)


def test_a_bootstrap_from_a_dataframe_then_a_stream_run_equals_the_model(spark, spark_context, tmp_path: Path) -> None:
    seeded = {user: 100 + i for i, user in enumerate(USERS[:17])}
    frame = spark.createDataFrame([(key, value) for key, value in seeded.items()], "key string, value long")
    records = [(USERS[i % 23], f"/p{i % 4}") for i in range(150)]
    lay_out(tmp_path / "in", records, 2)
    path = job_file(tmp_path, 2, "in")
    localstate.spark.bootstrap(frame.repartition(3), str(path), store="counts")
    assert counts_of(spark, path) == seeded
    with pytest.raises(StateExistsError):  # the job has state now: not bootstrapped over unless asked
        localstate.spark.bootstrap(frame, str(path), store="counts")
    SparkJobRunner(load_job_config(path), context=spark_context, batch_size=40, progress=None).run(until_drained=True)
    assert counts_of(spark, path) == model(records, seeded)
