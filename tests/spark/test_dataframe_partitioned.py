"""The DataFrame step on input already partitioned by key (``partitioned=True``): one mapInArrow stage,
no shuffle; state and outputs exact against plain Python with the per-record and the batch task, a
re-executed batch id not applied twice, a row in the wrong Spark partition refused with InputError
naming its key before any partition commits. Also what every path shares since: the batch's own fields
reach the tasks as JSON in a local property (never pickled), and the apply stage (its Python UDF) is
made once per DataFrame shape, not once per micro-batch."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the tasks module, as the Python workers import it
from dataframe_tasks import expected_outputs, job_config, read_state
from localstate.core.partitioner import partition_for
from localstate.errors import BatchOrderError, InputError
from localstate.runtime.layout import checkpoint_store
from localstate.runtime.spark import dataframe
from localstate.spark import run_batch

from .test_dataframe_batch import SCHEMA, _batches, spark  # noqa: F401 - spark: the module's session fixture

pytestmark = pytest.mark.spark
TASKS = {"record": "dataframe_tasks:CountAndRank", "batch": "dataframe_tasks:CountAndRankBatch"}


def _by_key(spark, rows: list[dict], partitions: int, spark_partitions: int | None = None,
            place=None):
    """``rows`` as a DataFrame whose Spark partition p holds the rows ``place(row)`` gives p (by
    default the job partition of the row's key), in their input order."""
    place = place or (lambda row: partition_for(row["user"], partitions))
    slots: list[list[tuple]] = [[] for _ in range(spark_partitions or partitions)]
    for row in rows:
        slots[place(row)].append((row["user"], row["page"], row["ts"]))
    rdd = spark.sparkContext.parallelize(range(len(slots)), len(slots)).flatMap(lambda p: slots[p])
    return spark.createDataFrame(rdd, SCHEMA)


def _rows(out) -> list[tuple[int, str, int, str]]:
    return [(row.batch_id, json.loads(row.key), *json.loads(row.value)[:2]) for row in out.collect()]


@pytest.mark.parametrize("task", ["record", "batch"])
def test_input_partitioned_by_key_is_applied_exactly_in_one_stage(spark, tmp_path, task):
    job = job_config(tmp_path / "state", partitions=3, task=TASKS[task])
    batches = _batches(7, [300, 1, 250, 400])
    got = []
    for batch_id, batch in enumerate(batches):
        df = _by_key(spark, batch, 3)
        spec = dataframe.dataframe_spec(df, job, key="user", order_by="ts")
        plan = dataframe._batch_job(df, spec, True)._jdf.queryExecution().executedPlan().toString()
        assert "Exchange" not in plan and "MapInArrow" in plan  # one stage: read, project, apply
        reports = []
        got += _rows(run_batch(df, job, key="user", order_by="ts", batch_id=batch_id, partitioned=True,
                               progress=reports.append))
        assert reports[0].records == len(batch)
        if batch_id == 2:  # Spark executes the batch again: the same rows, not applied twice
            again = []
            assert sorted(_rows(run_batch(df, job, key="user", order_by="ts", batch_id=2, partitioned=True,
                                          progress=again.append))) == sorted(r for r in got if r[0] == 2)
            assert again[0].records == 0 and again[0].applied == []
    counts, expected = expected_outputs(batches)
    assert sorted(got) == sorted(expected)
    assert read_state(job)[0] == counts


def test_without_order_column_rows_are_fed_in_input_order(spark, tmp_path):
    job = job_config(tmp_path / "state", partitions=2)
    rows = [{"user": f"user-{i % 5}", "page": f"/p/{i}", "ts": -i} for i in range(200)]  # ts against input order
    out = _rows(run_batch(_by_key(spark, rows, 2), job, key="user", batch_id=0, partitioned=True))
    seen: dict[str, int] = {}
    expected = []
    for row in rows:
        seen[row["user"]] = seen.get(row["user"], 0) + 1
        expected.append((0, row["user"], seen[row["user"]], row["page"]))
    assert sorted(out) == sorted(expected)


def test_a_row_in_another_partition_fails_the_batch_naming_its_key(spark, tmp_path):
    job = job_config(tmp_path / "state", partitions=3)
    rows = _batches(3, [200])[0]
    stray = next(row for row in rows if partition_for(row["user"], 3) == 2)
    df = _by_key(spark, rows, 3, place=lambda row: 0 if row is stray else partition_for(row["user"], 3))
    with pytest.raises(InputError) as info:
        run_batch(df, job, key="user", order_by="ts", batch_id=0, partitioned=True)
    assert repr(stray["user"]) in str(info.value) and "job partition 2" in str(info.value)
    assert info.value.context["partition"] == 0 and "partitioned=False" in info.value.hint
    # An extra Spark partition, beyond the job's partitions, holding rows.
    extra = _by_key(spark, rows, 3, spark_partitions=4, place=lambda row: 3 if row is stray else
                    partition_for(row["user"], 3))
    with pytest.raises(InputError, match="Spark partition 3 and the job 3 partitions"):
        run_batch(extra, job, key="user", order_by="ts", batch_id=0, partitioned=True)
    committed = checkpoint_store(job).load_all(3).values()
    assert all(checkpoint is None or checkpoint.batch is None for checkpoint in committed)  # no partition committed
    run_batch(_by_key(spark, rows, 3), job, key="user", order_by="ts", batch_id=0, partitioned=True)
    assert read_state(job)[0] == expected_outputs([rows])[0]


def test_batch_fields_travel_as_json_and_a_bad_property_is_refused(monkeypatch, tmp_path):
    """The batch's own fields go to the apply tasks as a JSON local property of plain values: nothing
    the executor unpickles."""
    job = job_config(tmp_path / "state")
    spec = dataframe.DataFrameSpec(job, "user", columns=("user", "page", "ts"))
    task = dataframe._BatchTask(spec, 4, "dataframe:app-1", True, False, {"partition": 1, "batch": 4, "after": 3,
                                                                          "marker": "m"}, "/tmp/x", True)
    value = task.property_value()
    assert json.loads(value) == {"batch": 4, "run_id": "dataframe:app-1", "keep_open": True, "tune_worker": False,
                                 "fault": {"partition": 1, "batch": 4, "after": 3, "marker": "m"},
                                 "exchange": "/tmp/x"}
    properties = {dataframe.BATCH_PROPERTY: value}
    context = SimpleNamespace(getLocalProperty=properties.get)
    monkeypatch.setattr(dataframe, "TaskContext", SimpleNamespace(get=lambda: context))
    assert dataframe._BatchTask.on_executor(spec, True) == task
    for bad in ("gASVCgAAAAAAAACMBmxvY2Fs", "[4]", '{"batch": "4"}', json.dumps({**json.loads(value), "batch": None})):
        properties[dataframe.BATCH_PROPERTY] = bad
        with pytest.raises(BatchOrderError, match="cannot read"):
            dataframe._BatchTask.on_executor(spec, True)
    del properties[dataframe.BATCH_PROPERTY]
    with pytest.raises(BatchOrderError, match="found no"):
        dataframe._BatchTask.on_executor(spec, False)


def test_the_apply_stage_is_made_once_per_dataframe_shape(spark, tmp_path):
    """Micro-batches of one shape share one apply stage (its Python UDF and JVM objects), on both
    paths; its tasks read each batch's fields from the local property, which is unset afterwards."""
    job = job_config(tmp_path / "state", partitions=2)
    batches = _batches(11, [120, 80, 150])
    facts = dataframe._context_facts(spark.sparkContext)
    facts.pop("apply stages", None)
    got = []
    for batch_id, batch in enumerate(batches):
        partitioned = batch_id % 2 == 1
        df = _by_key(spark, batch, 2) if partitioned else spark.createDataFrame(batch, SCHEMA).repartition(3)
        got += _rows(run_batch(df, job, key="user", order_by="ts", batch_id=batch_id, partitioned=partitioned))
        assert spark.sparkContext.getLocalProperty(dataframe.BATCH_PROPERTY) is None
    stages = facts["apply stages"]
    assert sorted(stage.partitioned for stage in stages) == [False, True]  # three batches, two shapes
    assert sorted(got) == sorted(expected_outputs(batches)[1])
    assert read_state(job)[0] == expected_outputs(batches)[0]


def test_a_python_source_in_the_same_stage_leaves_the_apply_workers_theirs(spark, tmp_path):
    """With ``partitioned`` the read of a Python data source (``localstate-kafka``) and the apply run in
    one stage, each task on two Python workers. The apply tasks take theirs from a pool of their own
    (:data:`APPLY_WORKERS_ENV`): a worker that read a batch's input never applies one, so the worker
    that keeps a partition open is among the apply workers of the next batch (with one pool, the
    workers went idle in the order read, apply, and each batch swapped the two roles: nothing stayed
    open). State exact, and with each batch's instances kept open, reused from the second on."""
    from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

    from localstate.spark import release

    readers = tmp_path / "readers"
    readers.mkdir()

    class KeyedReader(DataSourceReader):
        def __init__(self, options):
            self.rows, self.where = json.loads(options["rows"]), options["readers"]

        def partitions(self):
            return [InputPartition(slot) for slot in range(len(self.rows))]

        def read(self, partition):
            import os

            open(os.path.join(self.where, str(os.getpid())), "w").close()  # this process read input
            for user, page, ts in self.rows[partition.value]:
                yield user, page, ts

    class KeyedSource(DataSource):
        @classmethod
        def name(cls):
            return "localstate-test-keyed"

        def schema(self):
            return SCHEMA

        def reader(self, schema):
            return KeyedReader(self.options)

    spark.dataSource.register(KeyedSource)
    job = job_config(tmp_path / "state", partitions=2)
    batches = _batches(13, [150, 120, 170, 90, 110])
    reports = []
    for batch_id, batch in enumerate(batches):
        slots: list[list[tuple]] = [[], []]
        for row in batch:
            slots[partition_for(row["user"], 2)].append((row["user"], row["page"], row["ts"]))
        df = (spark.read.format("localstate-test-keyed").option("rows", json.dumps(slots))
              .option("readers", str(readers)).load())
        run_batch(df, job, key="user", order_by="ts", batch_id=batch_id, keep_open=True, partitioned=True,
                  progress=reports.append)
    release(job)
    appliers = {pid for report in reports for pid in report.workers.values()}
    assert appliers.isdisjoint(int(name) for name in os.listdir(readers))
    assert read_state(job)[0] == expected_outputs(batches)[0]
    assert all(sorted(report.reused) == [0, 1] for report in reports[2:]), [r.reused for r in reports]
