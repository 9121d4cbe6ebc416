"""The DataFrame entry point on batch DataFrames: results exact against plain Python with a kv and a
heap store, a re-executed batch id is not applied twice and gets the same rows, and bad input gets
typed errors naming the column or batch."""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the tasks module, as the Python workers import it
from dataframe_tasks import expected_outputs, job_config, read_state
from localstate.core.checkpoint import Checkpoint, CheckpointStore
from localstate.spark import OUTPUT_SCHEMA, run_batch
from localstate.errors import BatchOrderError, CheckpointError, SchemaError
from pyspark.sql import functions as F

SCHEMA = "user string, page string, ts long"


@pytest.fixture(scope="module")
def spark(spark_context):
    from pyspark.sql import SparkSession

    return SparkSession(spark_context)


def _batches(seed: int, sizes: list[int], users: int = 40) -> list[list[dict]]:
    rng = random.Random(seed)
    ts = iter(rng.sample(range(10**6), sum(sizes)))  # unique, shuffled: the order column is not the input order
    return [[{"user": f"user-{rng.randrange(users)}", "page": f"/p/{rng.randrange(9)}", "ts": next(ts)}
             for _ in range(size)] for size in sizes]


def _rows(out) -> list[tuple[int, str, int, str]]:
    rows = []
    for row in out.collect():
        count, page, _ = json.loads(row.value)
        assert row.stream == "counts"
        rows.append((row.batch_id, json.loads(row.key), count, page))
    return rows


def test_batches_exact_and_rerun_is_not_applied_twice(spark, tmp_path):
    job = job_config(tmp_path / "state", partitions=3)
    batches = _batches(1, [300, 200, 250])
    outputs = []
    for batch_id, batch in enumerate(batches):
        df = spark.createDataFrame(batch, SCHEMA).repartition(4)
        out = run_batch(df, job, key="user", order_by="ts", batch_id=batch_id)
        assert out.schema.simpleString() == spark.createDataFrame([], OUTPUT_SCHEMA).schema.simpleString()
        outputs.append(sorted(out.collect()))
        if batch_id == 1:
            # Spark executes batch 1 again (a failed sink write, a restarted query): same rows, not re-applied.
            reports = []
            again = run_batch(df, job, key="user", order_by="ts", batch_id=1, progress=reports.append)
            assert sorted(again.collect()) == outputs[1]
            assert reports[0].records == 0 and reports[0].applied == []
            assert sorted(reports[0].replayed) == sorted({row.partition for row in outputs[1]})
    counts, expected_rows = expected_outputs(batches)
    assert sorted(r for out in outputs for r in _rows(spark.createDataFrame(out, OUTPUT_SCHEMA))) == \
        sorted(expected_rows)
    state_counts, scores = read_state(job)
    assert state_counts == counts
    assert scores == {user: float(count) for user, count in counts.items()}
    # Within a partition, outputs follow the order column: seq and ts agree.
    for out in outputs:
        by_partition: dict[int, list] = {}
        for row in sorted(out, key=lambda r: (r.partition, r.seq)):
            by_partition.setdefault(row.partition, []).append(json.loads(row.value)[2])
        assert all(ts == sorted(ts) for ts in by_partition.values())


def test_batch_id_none_applies_the_next_batch(spark, tmp_path):
    job = job_config(tmp_path / "state")
    batches = _batches(2, [50, 60])
    for batch in batches:
        run_batch(spark.createDataFrame(batch, SCHEMA), job, key="user", order_by="ts")
    checkpoints = CheckpointStore(tmp_path / "state" / job.name / "checkpoints")
    assert {checkpoints.load(p).batch for p in range(job.partitions)} == {1}
    assert read_state(job)[0] == expected_outputs(batches)[0]


def test_input_order_without_order_column(spark, tmp_path):
    """Without order_by, each partition is fed in the input order, the same on every execution."""
    job = job_config(tmp_path / "state")
    rows = [{"user": "user-1", "page": f"/p/{i}", "ts": 0} for i in range(200)]
    df = spark.createDataFrame(rows, SCHEMA).coalesce(1)
    out = _rows(run_batch(df, job, key="user", batch_id=0))
    assert sorted(out, key=lambda r: r[2]) == [(0, "user-1", i + 1, f"/p/{i}") for i in range(200)]


def test_missing_key_column_lists_the_columns(spark, tmp_path):
    df = spark.createDataFrame([("a", "/p", 1)], SCHEMA)
    with pytest.raises(SchemaError) as info:
        run_batch(df, job_config(tmp_path / "state"), key="usr")
    assert info.value.context["column"] == "usr"
    assert "user string, page string, ts bigint" in str(info.value)
    with pytest.raises(SchemaError, match="order_by column 'time'"):
        run_batch(df, job_config(tmp_path / "state"), key="user", order_by="time")


def test_column_types_the_task_cannot_get(spark, tmp_path):
    job = job_config(tmp_path / "state")
    df = spark.createDataFrame([("a", "/p", 1)], SCHEMA)
    with pytest.raises(SchemaError) as info:
        run_batch(df.selectExpr("user", "page", "ts", "make_interval(1, 2) AS span"), job, key="user")
    assert info.value.context["column"] == "span" and "interval" in str(info.value)
    with pytest.raises(SchemaError) as info:
        run_batch(df.selectExpr("CAST(ts AS DOUBLE) AS score", "page"), job, key="score")
    assert info.value.context["column"] == "score" and "double" in str(info.value)
    stamped = run_batch(df.selectExpr("user", "page", "CAST(ts AS TIMESTAMP) AS at"), job, key="user", order_by="at")
    assert json.loads(stamped.collect()[0].value)[2] == 1.0  # a timestamp column is the envelope's timestamp
    with pytest.raises(SchemaError, match="null key"):
        run_batch(spark.createDataFrame([(None, "/p", 1)], SCHEMA), job, key="user")
    assert read_state(job)[0] == {"a": 1}  # only the timestamped batch was applied


def test_batch_id_going_backwards(spark, tmp_path):
    job = job_config(tmp_path / "state")
    batches = _batches(3, [40, 40, 40])
    for batch_id in (0, 1, 2):
        run_batch(spark.createDataFrame(batches[batch_id], SCHEMA), job, key="user", order_by="ts", batch_id=batch_id)
    with pytest.raises(BatchOrderError) as info:
        run_batch(spark.createDataFrame(batches[0], SCHEMA), job, key="user", order_by="ts", batch_id=1)
    assert info.value.context["batch"] == 1 and info.value.context["committed"] == 2
    with pytest.raises(BatchOrderError):
        run_batch(spark.createDataFrame(batches[0], SCHEMA), job, key="user", batch_id=-1)
    assert read_state(job)[0] == expected_outputs(batches)[0]


def test_checkpoint_batch_field():
    """Old checkpoints (no batch) load with batch None and are written as before; a bad value is refused."""
    old = json.dumps({"format": 1, "partition": 0, "generation": 3, "inputs": {}, "changelogs": {}, "outputs": {}})
    assert Checkpoint.from_json(old, "old").batch is None
    assert "batch" not in json.loads(Checkpoint(0).to_json())
    assert Checkpoint.from_json(Checkpoint(0, batch=7).to_json(), "new").batch == 7
    for bad in (-1, "7", 1.5, True):
        with pytest.raises(CheckpointError, match="batch"):
            Checkpoint.from_json(json.dumps({**json.loads(old), "batch": bad}), "bad")


@pytest.mark.parametrize("partitions", [2, 3, 16])
def test_rows_land_in_their_own_spark_partition(spark, tmp_path, partitions):
    """The batch's shuffle (routed(), what run_batch applies): every row's job partition is
    partition_for of its key, computed in the JVM for string and integer keys (Kafka's murmur2 through
    commons-codec) and by the Arrow UDF for binary keys, and job partition p is Spark partition p (one
    job partition per apply task, all of them in parallel)."""
    from localstate.core.partitioner import partition_for
    from localstate.runtime.spark.dataframe import dataframe_spec, jvm_has_murmur2, routed

    rng = random.Random(partitions)
    alphabet = "az09-_ üß€日本𝄞"
    texts = ["", "a", "ab", "abc", "abcd"] + ["".join(rng.choice(alphabet) for _ in range(rng.randrange(30)))
                                              for _ in range(400)]
    numbers = [0, 1, -1, 2**31 - 1, -2**31, 2**63 - 1, -2**63] + [rng.randrange(-2**63, 2**63) for _ in range(300)]
    cases = [
        ("string", texts),
        ("binary", [t.encode() + bytes([rng.randrange(256)]) for t in texts]),
        ("bigint", numbers),
        ("int", [n % 2**31 - (2**30 if n % 2 else 0) for n in numbers]),
        ("smallint", list(range(-2**15, 2**15, 97))),
        ("tinyint", list(range(-128, 128))),
    ]
    job = job_config(tmp_path / "state", partitions=partitions)
    assert jvm_has_murmur2(spark)  # commons-codec ships with Spark: string and integer keys route in the JVM
    for (kind, keys), jvm in zip(cases + cases[:1], [True] * len(cases) + [False]):  # strings once more by UDF
        df = spark.createDataFrame([(k, i) for i, k in enumerate(keys)], f"k {kind}, i int").repartition(3) \
            .withColumnRenamed("k", "the key.`k`")  # a name the routing must quote (JVM and UDF)
        spec = dataframe_spec(df, job, key="the key.`k`")
        shuffled = routed(df, spec, jvm=jvm)  # the input columns travel under positional names
        rows = shuffled.select(F.col(f"__localstate_c{spec.columns.index('i')}").alias("i"),
                               F.col("__localstate_partition").alias("job"),
                               F.spark_partition_id().alias("spark")).collect()
        assert len(rows) == len(keys), kind
        for row in rows:
            assert row.job == partition_for(keys[row.i], partitions), (kind, keys[row.i])
            assert row.spark == row.job, kind


def test_jvm_lookups_are_made_once_per_spark_context():
    """jvm_has_murmur2 asks the JVM once per SparkContext (not every micro-batch); a new context asks again."""
    from types import SimpleNamespace

    from localstate.runtime.spark.dataframe import jvm_has_murmur2

    asked = []

    def for_name(name):
        asked.append(name)
        raise RuntimeError("ClassNotFoundException")  # what Py4J raises for a class the JVM lacks

    class Context:  # a SparkContext whose JVM lacks the class (weakly referenced, as SparkContext is)
        _jvm = SimpleNamespace(java=SimpleNamespace(lang=SimpleNamespace(Class=SimpleNamespace(forName=for_name))))

    def session():
        return SimpleNamespace(sparkContext=Context())

    first, second = session(), session()
    assert [jvm_has_murmur2(first) for _ in range(3)] == [False] * 3 and len(asked) == 1
    assert jvm_has_murmur2(second) is False and len(asked) == 2


def test_null_keys_are_refused_on_every_key_type(spark, tmp_path):
    """A null key fails the batch with SchemaError naming the column, before any partition applies it,
    whether the key is hashed in the JVM (string, integer) or by the Arrow UDF (binary)."""
    job = job_config(tmp_path / "state", partitions=3)
    for kind, key in (("string", "a"), ("bigint", 5), ("binary", b"a")):
        df = spark.createDataFrame([(key, "/p", 1), (None, "/p", 2)], f"user {kind}, page string, ts long")
        with pytest.raises(SchemaError, match="null key") as info:
            run_batch(df, job, key="user")
        assert info.value.context.get("column") == "user" or "'user'" in str(info.value)
    from localstate.runtime.layout import checkpoint_store

    committed = checkpoint_store(job).load_all(3).values()
    assert all(checkpoint is None or checkpoint.batch is None for checkpoint in committed)  # no batch applied


def test_column_names_spark_cannot_resolve_plainly(spark, tmp_path):
    """Column names with a dot (read as a struct field), a space or a backtick: Spark's mapInArrow
    resolves its input by name and fails on some of them, so the columns travel to the apply stage
    under positional names; the key column is quoted in the routing SQL (the routing test above covers
    the Arrow UDF's quoting). Each batch is applied exactly, and the rows the task gets carry the
    original names. A name that appears twice is refused with SchemaError naming it."""
    from collections import Counter

    rows = [(f"user-{i % 11}", f"/p/{i % 4}", i) for i in range(120)]
    for index, column in enumerate(["user.id", "user `id`", "`", "user id"]):
        job = job_config(tmp_path / f"state-{index}", partitions=3)
        df = spark.createDataFrame(rows, SCHEMA).withColumnRenamed("user", column)
        out = run_batch(df, job, key=column, order_by="ts", batch_id=0)
        counts, _ = read_state(job)
        assert counts == dict(Counter(user for user, _, _ in rows)), column
        assert out.count() == len(rows), column
    joined = spark.createDataFrame(rows, SCHEMA).alias("a").join(
        spark.createDataFrame(rows, SCHEMA).alias("b"), "ts").select("a.user", "b.user", "a.page", "ts")
    with pytest.raises(SchemaError, match="'user' appears 2 times") as info:
        run_batch(joined, job_config(tmp_path / "dup"), key="ts")
    assert info.value.context["column"] == "user"
