"""Instances kept open in the Python workers across the micro-batches of a streaming query (the
DataFrame entry point, ``foreach_batch``) stay exact: Python workers SIGKILLed between two batches
and mid-batch, the query failing after localstate committed a batch and restarted from its
checkpointLocation (Spark replays that batch id: not applied twice, same outputs), a batch id
replayed on purpose, and another process changing the committed checkpoints between two batches
(a kept instance is then reopened, never reused). Also: the ``streaming.sql.batchId`` Spark sets on
the tasks is checked against the batch id the driver passed."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the tasks module, as the Python workers import it
from dataframe_tasks import expected_outputs, job_config, read_state  # noqa: E402
from localstate.runtime.layout import checkpoint_store
from localstate.errors import BatchOrderError  # noqa: E402
from localstate.spark import DataFrameBatch, foreach_batch, release, run_batch  # noqa: E402

pytestmark = [pytest.mark.spark]
SCHEMA = "user string, page string, ts long"


@pytest.fixture(scope="module")
def spark(spark_context):
    from pyspark.sql import SparkSession

    return SparkSession(spark_context)


def _batches(seed: int, sizes: list[int], users: int = 30) -> list[list[dict]]:
    rng = random.Random(seed)
    stamps = iter(rng.sample(range(10**6), sum(sizes)))  # the order column is not the input order
    return [[{"user": f"user-{rng.randrange(users)}", "page": f"/p/{rng.randrange(7)}", "ts": next(stamps)}
             for _ in range(size)] for size in sizes]


def _write_input(directory: Path, index: int, rows: list[dict]) -> None:
    directory.mkdir(exist_ok=True)
    path = directory / f"events-{index:03d}.json"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    os.utime(path, (1_700_000_000 + index, 1_700_000_000 + index))  # the file source takes them by age


def _sink_rows(sink: Path) -> dict[int, list[tuple]]:
    """The sink's rows per batch, as (batch, key, count, page); asserts that every attempt of a batch
    wrote the same rows."""
    import pyarrow.parquet as pq

    per_batch = {}
    for batch_dir in sorted(sink.iterdir()):
        batch_id = int(batch_dir.name)
        attempts = []
        for attempt in sorted(batch_dir.iterdir()):
            rows = []
            for row in pq.read_table(attempt).to_pylist():
                count, page, _ = json.loads(row["value"])
                assert row["batch_id"] == batch_id and row["stream"] == "counts"
                rows.append((batch_id, json.loads(row["key"]), count, page))
            attempts.append(sorted(rows))
        assert all(rows == attempts[0] for rows in attempts), f"the attempts of batch {batch_id} differ"
        per_batch[batch_id] = attempts[0]
    return per_batch


def _bump_generations(job) -> None:
    """Another process rewrites every committed checkpoint with a newer generation (what a second
    instance taking the partition over does), leaving the state it names as it is."""
    script = ("import sys, dataclasses, pathlib; from localstate.core.checkpoint import CheckpointStore\n"
              "store = CheckpointStore(pathlib.Path(sys.argv[1]))\n"
              "for p in range(int(sys.argv[2])):\n"
              "    c = store.load(p)\n"
              "    if c is not None:\n"
              "        store.save(dataclasses.replace(c, generation=c.generation + 1))\n")
    root = checkpoint_store(job).root
    subprocess.run([sys.executable, "-c", script, str(root), str(job.partitions)], check=True, timeout=120)


def test_kept_instances_stay_exact_across_kills_restarts_replays_and_foreign_commits(spark, tmp_path):
    batches = _batches(11, [60, 50, 70, 55, 65, 50, 60])
    job = job_config(tmp_path / "state")
    source, sink, query_checkpoint = tmp_path / "input", tmp_path / "sink", tmp_path / "query"
    reports: list[DataFrameBatch] = []
    attempts: dict[int, int] = {}
    failed_once: set[int] = set()
    bumped: set[int] = set()
    fault = {"partition": 1, "batch": 4, "after": 7, "marker": str(tmp_path / "worker-killed")}
    apply = foreach_batch(job, key="user", order_by="ts", sink=lambda out, batch_id: write(out, batch_id),
                          progress=reports.append, fault=fault)

    def write(out, batch_id: int) -> None:
        attempts[batch_id] = attempts.get(batch_id, 0) + 1
        out.toPandas().to_parquet(sink / str(batch_id) / f"attempt-{attempts[batch_id]}.parquet")

    def handle(df, batch_id: int) -> None:
        (sink / str(batch_id)).mkdir(parents=True, exist_ok=True)
        if batch_id == 1:  # between batches 0 and 1: SIGKILL the Python workers holding the instances
            for pid in set(reports[-1].workers.values()):
                os.kill(pid, signal.SIGKILL)
        if batch_id == 5 and batch_id not in bumped:  # between batches 4 and 5: a foreign commit
            bumped.add(batch_id)
            _bump_generations(job)
        apply(df, batch_id)
        if batch_id == 3:  # the same batch id again, on purpose: served, not applied
            apply(df, batch_id)
            assert sorted(reports[-1].replayed) == sorted(reports[-2].applied) and not reports[-1].applied
        if batch_id == 2 and batch_id not in failed_once:  # the query dies after localstate committed
            failed_once.add(batch_id)
            raise RuntimeError("the query fails after localstate committed batch 2")

    def run_query() -> None:
        events = spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).json(str(source))
        query = events.writeStream.foreachBatch(handle).option("checkpointLocation", str(query_checkpoint)) \
            .trigger(availableNow=True).start()
        query.awaitTermination()

    try:
        for index in range(3):
            _write_input(source, index, batches[index])
        with pytest.raises(Exception, match="after localstate committed batch 2"):
            run_query()
        for index in range(3, len(batches)):
            _write_input(source, index, batches[index])
        run_query()  # restarted from its checkpointLocation: batch 2 again, then 3..6
    finally:
        release(job)

    assert (tmp_path / "worker-killed").exists()  # the mid-batch kill happened
    by_batch: dict[int, list[DataFrameBatch]] = {}
    for report in reports:
        by_batch.setdefault(report.batch_id, []).append(report)
        assert report.query_batch == report.batch_id  # Spark's own micro-batch id, checked on the executors
    assert sorted(by_batch) == list(range(len(batches)))
    assert [len(by_batch[b]) for b in range(len(batches))] == [1, 1, 2, 2, 1, 1, 1]
    replayed = by_batch[2][1]  # the restarted query re-executed batch 2: nothing applied again
    assert not replayed.applied and sorted(replayed.replayed) == [0, 1]
    assert not by_batch[5][0].reused  # the checkpoints changed under the kept instances: reopened
    for report in reports:  # an instance reused is one its worker kept: the process that last applied it
        for partition in report.reused:
            # (a batch served again, not applied, opens nothing: whichever worker served it keeps no instance)
            earlier = [r for r in reports[:reports.index(report)] if partition in r.applied]
            assert earlier and earlier[-1].workers[partition] == report.workers[partition]
    assert attempts == {0: 1, 1: 1, 2: 2, 3: 2, 4: 1, 5: 1, 6: 1}  # the sink saw each call once
    exchanges = checkpoint_store(job).root / "exchange"  # each batch's row exchange, removed after it
    assert exchanges.is_dir() and not list(exchanges.iterdir())

    counts, expected = expected_outputs(batches)
    got = _sink_rows(sink)
    assert sorted(got) == list(range(len(batches)))
    assert sorted(row for rows in got.values() for row in rows) == sorted(expected)  # exactly once
    state_counts, scores = read_state(job)
    assert state_counts == counts
    assert scores == {user: float(count) for user, count in counts.items()}


def test_batch_id_other_than_sparks_micro_batch_is_refused(spark, tmp_path):
    job = job_config(tmp_path / "state", name="df-wrong-batch")
    _write_input(tmp_path / "input", 0, _batches(3, [20])[0])
    seen: list[BaseException] = []

    def handle(df, batch_id: int) -> None:
        try:
            run_batch(df, job, key="user", batch_id=batch_id + 5)
        except BatchOrderError as exc:
            seen.append(exc)

    events = spark.readStream.schema(SCHEMA).json(str(tmp_path / "input"))
    query = events.writeStream.foreachBatch(handle).option("checkpointLocation", str(tmp_path / "query")) \
        .trigger(availableNow=True).start()
    query.awaitTermination()
    assert len(seen) == 1
    message = str(seen[0])
    assert "batch id 5" in message and "streaming.sql.batchId=0" in message
    assert read_state(job)[0] == {}  # nothing applied


def _partition_rows(keys: list[str], start: int):
    """A job partition's rows as the apply stage gets them (input columns, partition, sequence)."""
    import pyarrow as pa

    from localstate.runtime.spark.dataframe import _PARTITION, _SEQ

    n = len(keys)
    return pa.table({"user": keys, "page": ["/p"] * n, "ts": list(range(start, start + n)),
                     _PARTITION: pa.array([0] * n, pa.int32()), _SEQ: list(range(start, start + n))})


def test_kept_instance_is_reused_only_while_the_checkpoint_is_the_one_it_prepared(tmp_path):
    """This process plays both roles (the apply task of partition 0, keeping its instance, and the
    driver saving checkpoints): no Spark, so every step is deterministic."""
    from localstate.core.checkpoint import Checkpoint
    from localstate.core.partitioner import partition_for
    from localstate.runtime.spark.dataframe import DataFrameSpec, _BatchTask, _run_partition

    job = job_config(tmp_path / "state", name="df-kept-unit")
    spec = DataFrameSpec(job, "user", "dataframe", "ts", None, ("user", "page", "ts"), "number")
    keys = [key for key in (f"user-{i}" for i in range(40)) if partition_for(key, job.partitions) == 0][:4]
    checkpoints = checkpoint_store(job)
    expected: dict[str, int] = {}

    def run(batch: int, commit: bool = True) -> dict:
        rows = keys * 3
        result = _run_partition(_BatchTask(spec, batch, "run-1", keep_open=True, tune_worker=True), 0, _partition_rows(rows, batch * 100))
        assert result["error"] is None and result["applied"] and result["query_batch"] is None
        if commit:  # the driver's part: save what the task prepared
            checkpoint = Checkpoint.from_json(result["checkpoint"], "test")
            checkpoints.save(checkpoint, expect_generation=checkpoint.generation)
            for key in rows:
                expected[key] = expected.get(key, 0) + 1
        return result

    try:
        assert not run(0)["reused"]  # nothing kept yet: opened
        assert run(1)["reused"]  # its last batch was committed: the same instance, not reopened
        assert run(2)["reused"]
        _bump_generations(job)  # another process changed the committed checkpoint
        assert not run(3)["reused"]  # reopened, recovered to that checkpoint; its commit is not fenced
        assert run(4, commit=False)["reused"]  # the driver dies before saving batch 4's checkpoint
        assert not run(4)["reused"]  # not what the driver committed: rolled back, reopened, applied once
        assert run(5)["reused"]
    finally:
        release(job)
    assert checkpoints.load(0).batch == 5
    assert read_state(job)[0] == expected
