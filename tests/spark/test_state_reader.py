"""The state reader (``spark.read.format("localstate")``): after a real run it returns exactly the
committed state a plain-Python computation predicts, never records written after the checkpoint
(a crash between changelog flush and checkpoint, a SIGKILLed process), one Spark partition per job
partition; its checkpoints, changelog and change-feed views; typed errors; and it changes nothing."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import localstate.spark
from localstate.core.config import load_job_config
from localstate.runtime.layout import open_changelog_system
from localstate.runtime.partition.instance import TaskInstance
from localstate.core.serdes import IntSerde
from localstate.runtime.spark.runner import SparkJobRunner
from localstate.core.task import Envelope
from localstate.errors import ConfigError, SerdeError, StateNotFoundError
from localstate.streams.jsonl import write_jsonl

pytestmark = pytest.mark.spark

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "core"))
import crash_job  # noqa: E402 - tests/core: the kill -9 child job and its plain-Python expectation
from count_and_remember import CountAndRemember, stores_toml  # noqa: E402 - the job's task and its stores
from fs_snapshot import snapshot  # noqa: E402
PARTITIONS = 3
USERS = [f"user-{i:02d}" for i in range(11)]


def reader_job_head(name: str, partitions: int, task: str, input_name: str) -> str:
    """The ``[job]`` and ``[inputs.<input_name>]`` tables of a state-reader test job (jsonl input ``in``)."""
    return f"""
[job]
name = "{name}"
partitions = {partitions}
task = "{task}"
state_dir = "state"

[inputs.{input_name}]
system = "jsonl"
path = "in"
on_misrouted = "allow"  # the same users in every partition: state per partition

"""


JOB = reader_job_head("reader", PARTITIONS, "count_and_remember:CountAndRemember", "views") + stores_toml()


def records(partition: int, start: int, n: int) -> list[tuple[str, str]]:
    return [(USERS[(i * 5 + partition) % len(USERS)], "forget" if i % 11 == 10 else f"/page/{i % 4}")
            for i in range(start, start + n)]


def expected(rows: list[tuple[str, str]]) -> dict[str, dict]:
    """Plain Python: what the task's counts and last stores hold after ``rows``."""
    counts: dict[str, int] = {}
    last: dict[str, dict] = {}
    for user, value in rows:
        if value == "forget":
            counts.pop(user, None)
            last.pop(user, None)
        else:
            counts[user] = counts.get(user, 0) + 1
            last[user] = {"page": value}
    return {"counts": counts, "last": last}


def run_in_two_batches(spark_context, job_file: Path, rows, n: int, *, batch_size: int):
    """Write ``rows(p, 0, n)`` of every partition to ``in`` and run the job on Spark (2 batches); its config."""
    job = load_job_config(job_file)
    for p in range(job.partitions):
        write_jsonl(job_file.parent / "in", p, [{"key": u, "value": v} for u, v in rows(p, 0, n)])
    summary = SparkJobRunner(job, context=spark_context, batch_size=batch_size, progress=None).run()
    assert summary.records_in == n * job.partitions and len(summary.batches) == 2
    return job


def flush_without_checkpoint(job, task_factory, input_name: str, rows, start: int, n: int) -> None:
    """Process ``rows(p, start, n)`` in every partition and flush them, but never save the checkpoint (a crash)."""
    system = open_changelog_system(job)
    for p in range(job.partitions):
        instance = TaskInstance(job, p, system, task_factory=task_factory)
        instance.open()
        for offset, (user, value) in enumerate(rows(p, start, n), start=start):
            instance.process(Envelope(input_name, p, offset, user, value))
        instance.prepare_commit()  # flushed; the checkpoint is never saved
        instance.abandon()
    system.close()


def make_job(root: Path) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "job.toml").write_text(JOB)
    shutil.copy(HERE.parent / "core" / "count_and_remember.py", root)
    return root / "job.toml"


@pytest.fixture(scope="module")
def spark(spark_context):
    from pyspark.sql import SparkSession

    session = SparkSession(spark_context)
    localstate.spark.register(session)
    return session


@pytest.fixture(scope="module")
def spark_run(tmp_path_factory, spark_context):
    """A real run on Spark (2 batches), then 6 more records per partition flushed to the stores and
    changelogs but never checkpointed: a driver that died between the tasks' flush and its save.
    Returns (job file, committed state per partition, the state with the uncommitted tail)."""
    root = tmp_path_factory.mktemp("reader-spark")
    job_file = make_job(root)
    job = run_in_two_batches(spark_context, job_file, records, 60, batch_size=35)
    flush_without_checkpoint(job, CountAndRemember, "views", records, 60, 6)
    committed = {p: expected(records(p, 0, 60)) for p in range(PARTITIONS)}
    uncommitted = {p: expected(records(p, 0, 66)) for p in range(PARTITIONS)}
    assert committed != uncommitted  # else the test could not tell them apart
    return job_file, committed, uncommitted


def read(spark, job_file: Path, **options):
    return spark.read.format("localstate").option("job", str(job_file)).options(**options).load()


def by_partition(rows) -> dict[int, dict]:
    found: dict[int, dict] = {p: {} for p in range(PARTITIONS)}
    for row in rows:
        assert row["key"] not in found[row["partition"]], f"key {row['key']!r} twice"
        found[row["partition"]][row["key"]] = row["value"]
    return found


def test_state_is_exactly_the_committed_state_after_a_run(spark, spark_run):
    job_file, committed, _ = spark_run
    counts = read(spark, job_file, store="counts")
    assert counts.schema.simpleString() == "struct<partition:int,key:string,value:bigint>"
    assert by_partition(counts.collect()) == {p: committed[p]["counts"] for p in committed}
    last = read(spark, job_file, store="last")
    assert last.schema.simpleString() == "struct<partition:int,key:string,value:string>"
    decoded = [{"partition": r["partition"], "key": r["key"], "value": json.loads(r["value"])} for r in last.collect()]
    assert by_partition(decoded) == {p: committed[p]["last"] for p in committed}
    # Spark SQL over it: the total of committed views per partition.
    counts.createOrReplaceTempView("reader_counts")
    totals = {r["partition"]: r["total"] for r in spark.sql(
        "SELECT partition, SUM(value) AS total FROM reader_counts GROUP BY partition").collect()}
    assert totals == {p: sum(committed[p]["counts"].values()) for p in committed}


def test_one_spark_partition_per_job_partition(spark, spark_run):
    job_file, committed, _ = spark_run
    counts = read(spark, job_file, store="counts")
    assert counts.rdd.getNumPartitions() == PARTITIONS
    seen = counts.rdd.mapPartitionsWithIndex(lambda index, rows: [(index, sorted({r[0] for r in rows}))]).collect()
    assert sorted(seen) == [(p, [p]) for p in range(PARTITIONS)]


def test_heap_store_rows_are_typed(spark, spark_run):
    job_file, committed, uncommitted = spark_run
    top = read(spark, job_file, store="top")
    # item through the key serde, the score as a double, no payload (value_serde bytes: binary);
    # tests/spark/test_state_reader_columns.py checks every engine's columns against the engine
    assert top.schema.simpleString() == "struct<partition:int,item:string,score:double,payload:binary>"
    rows = top.collect()
    items = {p: sorted(r["item"] for r in rows if r["partition"] == p) for p in committed}
    pushed = {p: sorted({u for u, v in records(p, 0, 60) if v != "forget"}) for p in committed}
    assert items == pushed
    assert all(isinstance(r["score"], float) and r["payload"] is None for r in rows)


def test_raw_bytes(spark, spark_run):
    job_file, committed, _ = spark_run
    raw = read(spark, job_file, store="counts", raw="true")
    assert raw.columns == ["partition", "key_bytes", "value_bytes"]
    serde = IntSerde()
    got = {p: {bytes(r["key_bytes"]).decode(): serde.deserialize(bytes(r["value_bytes"]))
               for r in raw.collect() if r["partition"] == p} for p in committed}
    assert got == {p: committed[p]["counts"] for p in committed}


def test_checkpoints_view(spark, spark_run):
    job_file, _, _ = spark_run
    job = load_job_config(job_file)
    rows = read(spark, job_file, view="checkpoints").orderBy("partition").collect()
    assert [r["partition"] for r in rows] == list(range(PARTITIONS))
    for row in rows:
        saved = json.loads((job.state_dir / "reader" / "checkpoints" / f"{row['partition']}.json").read_text())
        assert row["committed"] and row["generation"] == saved["generation"]
        assert row["inputs"] == saved["inputs"] == {"views": 60}
        assert row["changelogs"] == saved["changelogs"] and row["outputs"] == saved["outputs"]


def test_changelog_view_and_change_feed(spark, spark_run):
    job_file, committed, uncommitted = spark_run
    job = load_job_config(job_file)
    rows = read(spark, job_file, view="changelog").collect()
    assert sorted({r["store"] for r in rows}) == ["cache", "counts", "last", "top"]  # scratch is not logged
    counts = {r["partition"]: r for r in rows if r["store"] == "counts"}
    for p, row in counts.items():
        saved = json.loads((job.state_dir / "reader" / "checkpoints" / f"{p}.json").read_text())
        assert row["committed_offset"] == saved["changelogs"]["counts"]
        assert row["end_offset"] > row["committed_offset"] and row["uncommitted"]
        assert row["exists"] and Path(row["location"]).is_dir()
        on_disk = sorted(f.name for f in Path(row["location"]).iterdir() if f.name.endswith(".log"))
        assert [s["name"] for s in row["segments"]] == on_disk
        assert row["bytes"] == sum(s["bytes"] for s in row["segments"]) > 0
    # The change feed up to the committed offset replays to the committed state; past it ("end"),
    # the records marked uncommitted lead to the uncommitted state.
    feed = read(spark, job_file, view="changelog", store="counts", readChangeFeed="true", endOffset="end")
    assert feed.columns == ["partition", "offset", "key", "value", "tombstone", "committed"]
    events = sorted(feed.collect(), key=lambda r: (r["partition"], r["offset"]))
    for p in range(PARTITIONS):
        mine = [r for r in events if r["partition"] == p]
        assert [r["offset"] for r in mine] == list(range(counts[p]["end_offset"]))
        assert all(r["committed"] == (r["offset"] < counts[p]["committed_offset"]) for r in mine)
        assert any(r["tombstone"] and r["value"] is None for r in mine)
        for cut, state in ((True, committed[p]["counts"]), (False, uncommitted[p]["counts"])):
            replayed: dict = {}
            for r in mine:
                if cut and not r["committed"]:
                    break
                replayed.pop(r["key"], None) if r["tombstone"] else replayed.__setitem__(r["key"], r["value"])
            assert replayed == state
    default = read(spark, job_file, view="changelog", store="counts", readChangeFeed="true", startOffset="2")
    assert {(r["partition"], r["offset"]) for r in default.collect()} == {
        (r["partition"], r["offset"]) for r in events if r["committed"] and r["offset"] >= 2}


def test_errors_are_typed_with_hints(spark, spark_run, tmp_path):
    job_file, _, _ = spark_run
    with pytest.raises(StateNotFoundError, match="no store 'countz'.*did you mean 'counts'"):
        localstate.spark.read_state(spark, job_file, store="countz")
    with pytest.raises(ConfigError, match="unknown option.*did you mean 'readChangeFeed'"):
        localstate.spark.read_state(spark, job_file, store="counts", readChangeFed="true")
    with pytest.raises(ConfigError, match="unknown view 'checkpoint'.*did you mean 'checkpoints'"):
        localstate.spark.read_state(spark, job_file, view="checkpoint")
    with pytest.raises(ConfigError, match="state view reads one store"):
        localstate.spark.read_state(spark, job_file)
    with pytest.raises(ConfigError, match="true or false"):
        localstate.spark.read_state(spark, job_file, store="counts", raw="yes")
    with pytest.raises(ConfigError, match="non-negative integer"):
        localstate.spark.read_state(spark, job_file, view="changelog", store="counts", readChangeFeed=True,
                                    startOffset=-1)
    with pytest.raises(StateNotFoundError, match="not logged"):
        localstate.spark.read_state(spark, job_file, store="scratch")
    with pytest.raises(StateNotFoundError, match="state after no DataFrame batch, not after batch 7"):
        localstate.spark.read_state(spark, job_file, store="counts", batchId=7)
    with pytest.raises(ConfigError):
        localstate.spark.read_state(spark, tmp_path / "missing.toml", store="counts")
    never = make_job(tmp_path / "never-ran")
    with pytest.raises(StateNotFoundError, match="(?s)has no state.*run it first"):
        localstate.spark.read_state(spark, never, store="counts")
    # Through Spark's own API the error reaches the user as Spark's AnalysisException carrying the
    # Python error (type, message, hint), and no Java frame.
    from pyspark.errors import AnalysisException

    with pytest.raises(AnalysisException) as caught:
        read(spark, job_file, store="countz")
    text = str(caught.value)
    assert "localstate.errors.StateNotFoundError" in text and "stores of this job" in text
    assert "\tat org.apache" not in text and "at java." not in text
    # A value its serde cannot decode names the record, where raw bytes always read.
    from localstate.runtime.spark.state_source import ReadOptions, load_view

    view, resolved = load_view(ReadOptions.parse({"job": str(job_file), "store": "counts"}))
    with pytest.raises(SerdeError, match="(?s)cannot decode.*partition=0"):
        view.decoding.value(b"\x01", {"partition": 0})


def test_reading_changes_nothing(spark, spark_run):
    job_file, _, _ = spark_run
    state = job_file.parent / "state"
    before = snapshot(state)
    for options in ({"store": "counts"}, {"store": "last"}, {"store": "top"}, {"store": "counts", "raw": "true"},
                    {"view": "checkpoints"}, {"view": "changelog"},
                    {"view": "changelog", "store": "last", "readChangeFeed": "true", "endOffset": "end"}):
        read(spark, job_file, **options).collect()
    with pytest.raises(StateNotFoundError):
        localstate.spark.read_state(spark, job_file, store="countz")
    assert snapshot(state) == before


def test_at_an_older_checkpoint_copy(spark, tmp_path):
    """checkpointDir: a copy of the checkpoints taken after an earlier commit reads the state then."""
    job_file = make_job(tmp_path / "job")
    job = load_job_config(job_file)
    system = open_changelog_system(job)
    instances = [TaskInstance(job, p, system, task_factory=CountAndRemember) for p in range(PARTITIONS)]
    for p, instance in enumerate(instances):
        instance.open()
        for offset, (user, value) in enumerate(records(p, 0, 20)):
            instance.process(Envelope("views", p, offset, user, value))
        instance.commit()
    shutil.copytree(job.state_dir / "reader" / "checkpoints", tmp_path / "copy", ignore=shutil.ignore_patterns("*.lock"))
    for p, instance in enumerate(instances):
        for offset, (user, value) in enumerate(records(p, 20, 30), start=20):
            instance.process(Envelope("views", p, offset, user, value))
        instance.close(commit=True)
    system.close()
    old = by_partition(read(spark, job_file, store="counts", checkpointDir=str(tmp_path / "copy")).collect())
    assert old == {p: expected(records(p, 0, 20))["counts"] for p in range(PARTITIONS)}
    now = by_partition(read(spark, job_file, store="counts").collect())
    assert now == {p: expected(records(p, 0, 50))["counts"] for p in range(PARTITIONS)}
    with pytest.raises(StateNotFoundError, match="does not exist"):
        localstate.spark.read_state(spark, job_file, store="counts", checkpointDir=str(tmp_path / "nowhere"))


CRASH_JOB = """
[job]
name = "crash"
partitions = 1
task = "crash_job:CountingTask"
state_dir = "{state}"

[stores.per_key]
engine = "kv"
backend = "rocksdb"
key_serde = "string"
value_serde = "int"

[stores.per_bucket]
engine = "kv"
backend = "lmdb"
key_serde = "int"
value_serde = "int"
"""


def test_sigkill_between_changelog_flush_and_checkpoint(spark, tmp_path):
    """A real kill -9 at the crash point after the stores and changelogs are flushed and before the
    checkpoint is written (tests/core/crash_job.py): the reader shows the previous commit."""
    state = tmp_path / "state"
    env = dict(os.environ, LOCALSTATE_CRASH_AT="after_flush:3", LOCALSTATE_TESTING="1")
    proc = subprocess.run([sys.executable, str(HERE.parent / "core" / "crash_job.py"), str(state), "run", "2000",
                           "300"], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    job_file = tmp_path / "job.toml"
    job_file.write_text(CRASH_JOB.format(state=state))
    checkpoint = json.loads((state / "crash" / "checkpoints" / "0.json").read_text())
    position = checkpoint["inputs"]["input"]
    assert position == 600  # two commits of 300; the third was flushed, then the process died
    per_key, per_bucket = crash_job.expected_state(position)
    log = read(spark, job_file, view="changelog").collect()
    assert all(r["end_offset"] > r["committed_offset"] for r in log)  # the uncommitted tail is there
    got = {r["key"]: r["value"] for r in read(spark, job_file, store="per_key").collect()}
    assert got == per_key
    buckets = read(spark, job_file, store="per_bucket")
    assert buckets.schema.simpleString() == "struct<partition:int,key:bigint,value:bigint>"
    assert {r["key"]: r["value"] for r in buckets.collect()} == per_bucket


def test_read_state_resolves_relative_paths_on_the_driver(spark, spark_run, monkeypatch, tmp_path):
    job_file, committed, _ = spark_run
    monkeypatch.chdir(job_file.parent)
    counts = localstate.spark.read_state(spark, "job.toml", store="counts")
    monkeypatch.chdir(tmp_path)  # the DataFrame keeps reading the same job from anywhere
    assert by_partition(counts.collect()) == {p: committed[p]["counts"] for p in committed}
