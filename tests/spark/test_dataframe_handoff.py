"""How localstate's Spark job hands rows over, without changing what it computes: Arrow batches of
:data:`ARROW_BATCH_ROWS` rows unless the session chose a size, adaptive query execution off for its
job only (the session's settings are left as they were), one Spark job per batch, and a batch
without outputs gives the sink an empty local relation (built once per JVM session)."""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the tasks module, as the Python workers import it
from dataframe_tasks import expected_outputs, job_config, read_state
from localstate.runtime.spark.dataframe import batch_outputs
from localstate.spark import OUTPUT_SCHEMA, run_batch

pytestmark = pytest.mark.spark
SCHEMA = "user string, page string, ts long"
ARROW_CONF = "spark.sql.execution.arrow.maxRecordsPerBatch"
AQE_CONF = "spark.sql.adaptive.enabled"


@pytest.fixture(scope="module")
def spark(spark_context):
    from pyspark.sql import SparkSession

    return SparkSession(spark_context)


def _batches(seed: int, sizes: list[int]) -> list[list[dict]]:
    rng = random.Random(seed)
    ts = iter(rng.sample(range(10**6), sum(sizes)))
    return [[{"user": f"user-{rng.randrange(30)}", "page": f"/p/{rng.randrange(9)}", "ts": next(ts)}
             for _ in range(size)] for size in sizes]


def test_arrow_batch_size_is_set_for_localstates_job_only(spark, tmp_path):
    job = job_config(tmp_path / "state")
    batches = _batches(3, [400, 300, 200])
    assert spark.conf.get(ARROW_CONF, None) is None
    outputs = [run_batch(spark.createDataFrame(batches[0], SCHEMA).repartition(3), job, key="user", order_by="ts",
                         batch_id=0).collect()]
    assert spark.conf.get(ARROW_CONF, None) is None  # unset again after the job: Spark's default
    spark.conf.set(ARROW_CONF, "7")  # the user's choice is kept: many small Arrow batches per partition
    try:
        outputs.append(run_batch(spark.createDataFrame(batches[1], SCHEMA).repartition(3), job, key="user",
                                 order_by="ts", batch_id=1).collect())
        assert spark.conf.get(ARROW_CONF) == "7"
        # Spark's default value set explicitly is a choice too: kept, and still set afterwards.
        spark.conf.set(ARROW_CONF, "10000")
        outputs.append(run_batch(spark.createDataFrame(batches[2], SCHEMA).repartition(2), job, key="user",
                                 order_by="ts", batch_id=2).collect())
        assert spark.conf.get(ARROW_CONF, None) == "10000"
    finally:
        spark.conf.unset(ARROW_CONF)
    counts, expected = expected_outputs(batches)
    got = [(row.batch_id, json.loads(row.key), *json.loads(row.value)[:2]) for out in outputs for row in out]
    assert sorted(got) == sorted(expected)
    assert read_state(job)[0] == counts


def test_one_spark_job_per_batch_and_the_sessions_adaptive_setting_is_kept(spark, tmp_path):
    """The batch's read-route-shuffle and apply stages run as one Spark job (adaptive query execution
    would run the shuffle's map stage as a job of its own): AQE is off while localstate's job is
    planned and run, and the session's own setting (unset, true, false) is as it was afterwards."""
    job = job_config(tmp_path / "state")
    batches = _batches(9, [200, 150, 100])
    scheduler = spark.sparkContext._jsc.sc().dagScheduler()
    outputs = []
    for batch_id, (setting, batch) in enumerate(zip([None, "true", "false"], batches)):
        if setting is not None:
            spark.conf.set(AQE_CONF, setting)
        try:
            df = spark.createDataFrame(batch, SCHEMA).repartition(3)
            first = scheduler.nextJobId()
            out = run_batch(df, job, key="user", order_by="ts", batch_id=batch_id)
            assert scheduler.nextJobId() - first == 1  # reading the outputs' files runs no job before collect()
            assert spark.conf.get(AQE_CONF, None) == setting
            outputs += out.collect()
        finally:
            spark.conf.unset(AQE_CONF)
    counts, expected = expected_outputs(batches)
    got = [(row.batch_id, json.loads(row.key), *json.loads(row.value)[:2]) for row in outputs]
    assert sorted(got) == sorted(expected)
    assert read_state(job)[0] == counts


def test_batch_without_outputs_is_an_empty_local_relation(spark, tmp_path):
    job = job_config(tmp_path / "state")
    rows = _batches(5, [120])[0]
    first = run_batch(spark.createDataFrame(rows, SCHEMA), job, key="user", order_by="ts", batch_id=0)
    kept = sorted(first.collect())
    assert len(kept) == len(rows)
    assert sorted(batch_outputs(spark, job, 0).collect()) == kept  # read from the checkpoints on disk
    empty = run_batch(spark.createDataFrame([], SCHEMA), job, key="user", order_by="ts", batch_id=1)
    assert empty.schema.simpleString() == spark.createDataFrame([], OUTPUT_SCHEMA).schema.simpleString()
    assert empty.collect() == []
    assert empty._jdf.queryExecution().optimizedPlan().getClass().getSimpleName() == "LocalRelation"
    assert read_state(job)[0] == expected_outputs([rows])[0]
    # Kept per JVM session: a foreachBatch micro-batch comes with a new Python session around the
    # query's JVM session, and gets the same relation, as a DataFrame of its own session.
    from pyspark.sql import SparkSession

    wrapper = SparkSession(spark.sparkContext, spark._jsparkSession)
    again = batch_outputs(wrapper, job, 1)
    assert again.sparkSession is wrapper and again._jdf.equals(empty._jdf) and again.collect() == []
    other = spark.newSession()  # another JVM session: a relation of its own
    separate = batch_outputs(other, job, 1)
    assert separate._jdf.sparkSession().equals(other._jsparkSession) and not separate._jdf.equals(empty._jdf)
    assert separate.schema == empty.schema and separate.collect() == []
