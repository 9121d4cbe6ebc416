"""What a batch costs besides its tasks, cut without losing a guarantee (runtime/spark/driver.py,
context.py): failed attempts counted from the results, plans from the checkpoints the run saved
(from disk at the start of every run), the JobConfig broadcast once per run, the partitions'
checkpoints saved concurrently and still fenced, no Unix domain sockets by default."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from localstate.core.checkpoint import Checkpoint
from localstate.core.config import load_job_config
from localstate.runtime.layout import checkpoint_store
from localstate.runtime.spark import driver
from localstate.runtime.spark.context import LOCAL_DEFAULTS, QUICK_JIT_OPTIONS, spark_conf
from localstate.runtime.spark.affinity.kept import settle_worker
from localstate.runtime.spark.runner import SparkJobRunner
from localstate.core.stream import open_output
from localstate.errors import FencedError
from localstate.streams.jsonl import read_jsonl
from counting_job import write_counting_job  # tests/ is on sys.path (tests/conftest.py)
from keyed_events import write_keyed_events

pytestmark = pytest.mark.spark

UDS = "spark.python.unix.domain.socket.enabled"


def _counting_job(directory: Path, name: str, records: int = 40) -> Path:
    """``records`` events over keys k0..k6, per partition of 2, counted by key (count_task)."""
    data = directory / "data"
    keys = [f"k{i % 7}" for i in range(records * 4)]
    write_keyed_events(data, keys, per_partition=records)
    return write_counting_job(directory, name)


def _expected(directory: Path) -> Counter:
    return Counter(record["key"] for partition in range(2) for record in read_jsonl(directory / "data", partition))


def _emitted(job) -> list[tuple[str, int]]:
    output = open_output(job, "counts-out")
    try:
        return [(key, count) for partition in range(2) for key, count in output.read(partition)]
    finally:
        output.close()


def _exactly_once(job) -> Counter:
    """Final count per key, after checking every emitted count is one more than the key's previous
    one (nothing applied twice, nothing lost)."""
    seen: Counter = Counter()
    for key, count in _emitted(job):
        assert count == seen[key] + 1, (key, count, seen[key])
        seen[key] = count
    return seen


def test_retried_attempt_is_counted_from_the_results(tmp_path, spark_context):
    """A task attempt killed in batch 1 is reported as exactly one failed attempt of that batch (the
    successful retry's attempt number), none for the other batches; the counts stay exact."""
    job = load_job_config(_counting_job(tmp_path, "retried"))
    marker = tmp_path / "killed-once"
    fault = {"partition": 0, "batch": 1, "after": 3, "marker": str(marker)}
    lines: list[str] = []
    summary = SparkJobRunner(job, context=spark_context, batch_size=10, fault=fault, progress=lines.append).run()
    assert marker.exists(), "the worker of partition 0 should have been SIGKILLed in batch 1"
    assert [b.failed_attempts for b in summary.batches] == [0, 1, 0, 0]
    assert "(1 failed task attempt(s) retried)" in lines[1] and "retried" not in lines[0] + lines[2]
    assert _exactly_once(job) == _expected(tmp_path)


def test_a_run_plans_from_disk_then_from_what_it_saved(tmp_path, spark_context):
    """Within a run the driver plans from the checkpoints it saved (equal to those on disk); each
    run starts from disk, so checkpoints committed meanwhile by another driver are honoured."""
    job = load_job_config(_counting_job(tmp_path, "planning"))
    first = SparkJobRunner(job, context=spark_context, batch_size=10, progress=None)
    assert first.run(batches=1).records_in == 20
    store = checkpoint_store(job)
    for partition in range(2):
        assert first.committed(partition) == store.load(partition) and first.committed(partition) is not None

    # A restarted driver (another runner) reads the checkpoints from disk and commits batch 2.
    restarted = SparkJobRunner(job, context=spark_context, batch_size=10, progress=None)
    plans, _ = restarted.plan(1)
    assert sorted(plan.ranges["events"] for plan in plans) == [(10, 20), (10, 20)]
    assert restarted.run(batches=1).records_in == 20

    # The first runner runs again: it must plan from disk (20), not from what it saved (10).
    again = first.run(batches=1)
    assert again.records_in == 20 and again.batches[0].lag == 20
    assert sorted(store.load(p).inputs["events"] for p in range(2)) == [30, 30]
    assert first.run().records_in == 20
    assert _exactly_once(job) == _expected(tmp_path)


def test_job_config_is_shipped_per_run_not_reused_across_jobs(tmp_path, spark_context):
    """Two jobs interleaved on one context (the same reused Python workers): each batch runs with
    its own run's JobConfig, so each job's state and outputs hold exactly its own input; the
    broadcast is freed when its run ends."""
    names = ("first", "second")
    jobs = [load_job_config(_counting_job(tmp_path / name, name, records=30)) for name in names]
    runners = [SparkJobRunner(job, context=spark_context, batch_size=10, progress=None) for job in jobs]
    for runner in runners:
        assert runner.run(batches=1).records_in == 20
        assert runner._shipped is None
    for runner in reversed(runners):
        assert runner.run().records_in == 40
    for name, job in zip(names, jobs):
        assert _exactly_once(job) == _expected(tmp_path / name)
        assert sorted(checkpoint_store(job).load(p).inputs["events"] for p in range(2)) == [30, 30]


def test_concurrent_checkpoint_saves_stay_fenced(tmp_path):
    """Saving a batch's checkpoints concurrently keeps each save fenced: a partition taken over by a
    newer generation refuses the save (FencedError), the other partition is committed."""
    job = load_job_config(_counting_job(tmp_path, "fenced"))
    runner = SparkJobRunner(job, context=object(), batch_size=10, progress=None)  # no Spark needed
    store = checkpoint_store(job)
    store.save(Checkpoint(1, generation=5, inputs={"events": 3}))
    try:
        with pytest.raises(FencedError) as raised:
            runner._save_checkpoints([Checkpoint(0, generation=1, inputs={"events": 10}),
                                      Checkpoint(1, generation=1, inputs={"events": 10})])
    finally:
        runner._end_run()
    assert raised.value.context["partition"] == 1
    assert store.load(0) == Checkpoint(0, generation=1, inputs={"events": 10})
    assert store.load(1) == Checkpoint(1, generation=5, inputs={"events": 3})
    assert runner.committed(0) == store.load(0)
    assert runner.committed(1) == store.load(1)  # not remembered as saved: planned from disk


def test_local_defaults_apply_to_local_masters_only_and_the_jobs_conf_wins(spark_context, monkeypatch):
    """Unix domain sockets between the executor and its Python workers by default on local masters
    (a micro-batch's fixed cost falls ~2x); a job's [spark] conf may turn them off, a default the JVM
    was started with (spark-submit --conf) is kept; cluster masters are left alone."""
    from pyspark import SparkContext

    assert LOCAL_DEFAULTS == {UDS: "true"}
    assert spark_context.getConf().get(UDS) == "true"  # the tests' own context runs on them too
    monkeypatch.setattr(SparkContext, "_jvm", None)  # SparkConf without the running JVM's defaults
    assert spark_conf("local[2]").get(UDS) == "true"
    assert spark_conf("local[2]", conf={UDS: "false"}).get(UDS) == "false"
    assert spark_conf("spark://10.0.0.1:7077", conf={"spark.task.maxFailures": "2"}).get(UDS) is None
    monkeypatch.setattr("pyspark.SparkConf.__init__", _conf_with_default(UDS, "false"))
    assert spark_conf("local[2]").get(UDS) == "false"


def test_two_partitions_run_at_once_over_the_default_worker_channel(tmp_path, spark_context):
    """The two tasks of a local[2] batch overlap in time (an earlier session saw them run one after
    the other over Unix domain sockets): each task reports when it ran, and the intervals intersect."""
    import time as clock

    def busy(seconds: float):
        def task(_: int, items) -> list[tuple[float, float]]:
            for _ in items:
                pass
            started = clock.time()
            while clock.time() - started < seconds:  # CPU work, as a batch's tasks do
                pass
            return [(started, clock.time())]
        return task

    for _ in range(3):
        spark_context.parallelize([], 2).mapPartitionsWithIndex(busy(0.0)).collect()  # reused workers
    (first_start, first_end), (second_start, second_end) = sorted(
        spark_context.parallelize([], 2).mapPartitionsWithIndex(busy(0.5)).collect())
    assert second_start < first_end, (first_start, first_end, second_start, second_end)


def test_quick_jit_goes_to_local_driver_jvms_of_localstate_run_only(monkeypatch, tmp_path):
    """localstate run starts a local driver JVM with the quick JIT (its JVM only schedules); the
    DataFrame path's contexts, cluster masters, and a job that sets its own driver JVM options do
    not get it; the log4j settings are kept beside it."""
    from pyspark import SparkContext

    monkeypatch.setattr(SparkContext, "_jvm", None)  # SparkConf without the running JVM's defaults
    java = "spark.driver.extraJavaOptions"
    quick = spark_conf("local[2]", quick_jit=True).get(java).split()
    assert QUICK_JIT_OPTIONS in quick and any(o.startswith("-Dlog4j2.configurationFile=") for o in quick)
    assert QUICK_JIT_OPTIONS not in spark_conf("local[2]").get(java)
    assert QUICK_JIT_OPTIONS not in spark_conf("spark://10.0.0.1:7077", quick_jit=True).get(java)
    assert spark_conf("local[2]", conf={java: "-Xss4m"}, quick_jit=True).get(java) == "-Xss4m"

    asked: list[dict] = []

    def record(master, app_name="localstate", conf=None, *, quick_jit=False, affinity=True):  # noqa: ANN001, ANN202
        asked.append({"master": master, "quick_jit": quick_jit, "affinity": affinity})
        return "context"

    monkeypatch.setattr(driver, "spark_context", record)
    job = load_job_config(_counting_job(tmp_path, "quick-jit"))
    runner = SparkJobRunner(job, master="local[2]", progress=None)
    assert runner.context == "context"
    assert asked == [{"master": "local[2]", "quick_jit": True, "affinity": True}]
    # Without worker affinity the driver JVM and the local Spark settings are Spark's own.
    asked.clear()
    path = _counting_job(tmp_path / "plain", "plain")
    text = path.read_text()
    text = text.replace("[spark]\n", "[spark]\nworker_affinity = false\n", 1) if "[spark]\n" in text \
        else text + "\n[spark]\nworker_affinity = false\n"
    path.write_text(text)
    assert SparkJobRunner(load_job_config(path), master="local[2]", progress=None).context == "context"
    assert asked == [{"master": "local[2]", "quick_jit": False, "affinity": False}]
    assert "spark.python.unix.domain.socket.enabled" not in dict(spark_conf("local[2]", affinity=False).getAll())
    assert dict(spark_conf("local[2]").getAll())["spark.python.unix.domain.socket.enabled"] == "true"


def test_a_worker_freezes_its_imports_once_and_still_collects_what_comes_later(spark_context, tmp_path):
    """settle_worker: in a Spark Python worker, the objects alive at its first localstate task go to
    the collector's permanent generation (PySpark's full gc.collect() after every task then skips
    them), once; cycles made afterwards are still collected. Outside a Spark task nothing happens."""
    job = load_job_config(_counting_job(tmp_path, "settle"))

    def probe(_: int, items) -> list:  # noqa: ANN001
        import gc

        from localstate.core.task import add_task_paths

        list(items)
        add_task_paths(job)
        settle_worker(job)  # froze now, or an earlier localstate task in this worker did
        frozen, again = gc.get_freeze_count(), settle_worker(job)

        class Node:
            pass

        first, second = Node(), Node()
        first.other, second.other = second, first
        del first, second
        return [(frozen, again, gc.collect())]

    results = spark_context.parallelize([], 2).mapPartitionsWithIndex(probe).collect()
    assert len(results) == 2
    for frozen, again, collected in results:
        assert frozen > 1000 and again is False and collected >= 2
    import gc

    before = gc.get_freeze_count()
    assert settle_worker(job) is False and gc.get_freeze_count() == before


def test_a_batch_task_worker_imports_what_its_batches_use_before_freezing(tmp_path):
    """For a BatchTask job, settle_worker imports the input systems and what the batch path imports
    lazily (Arrow, its compute and JSON modules, numpy, and the pandas pyarrow loads on its first
    conversion of Python values) before the freeze: a batch read and built afterwards imports no
    module, so PySpark's collection after each task has no unfrozen module to scan. In a fresh
    interpreter (a Spark worker's first task), with a task context as in a Spark task."""
    path = write_counting_job(tmp_path, "settle-batch", job={"task": "count_task:CountByKeyBatch"})
    write_keyed_events(tmp_path / "data", [f"k{i % 7}" for i in range(80)], per_partition=40)
    script = f"""
import sys
from localstate.core.config import load_job_config
from localstate.core.stream import open_input
from localstate.core.task import add_task_paths, record_batch
from localstate.runtime.spark.affinity import kept as instances

instances.task_context = lambda: object()  # as inside a Spark task
job = load_job_config({str(path)!r})
add_task_paths(job)
assert instances.settle_worker(job)
before = set(sys.modules)
for columns in open_input(job, "events").read_columns(0, 0, 40):
    batch = record_batch(["events"], columns.offsets, columns.keys, columns.values, columns.timestamps)
    import pyarrow.compute as pc
    pc.value_counts(batch.column("key")).field("values").to_pylist()
print(sorted(set(sys.modules) - before))
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]"


def test_opening_an_instance_in_a_worker_settles_it_first(spark_context, tmp_path):
    """checkout (where every instance of a Spark task is opened, on both paths) settles the worker
    before it opens anything: a worker not settled yet has frozen once the instance is open."""
    job = load_job_config(_counting_job(tmp_path, "settle-on-open"))

    def probe(slot: int, items) -> list:  # noqa: ANN001
        import gc

        from localstate.runtime.spark.affinity import kept as instances
        from localstate.core.task import add_task_paths

        list(items)
        add_task_paths(job)
        gc.unfreeze()
        instances._worker_settled = False  # as in a worker that never ran a localstate task
        lease = instances.checkout(job, slot, "settle-on-open")
        try:
            return [(instances._worker_settled, gc.get_freeze_count())]
        finally:
            lease.close()

    results = spark_context.parallelize([], 2).mapPartitionsWithIndex(probe).collect()
    assert len(results) == 2
    for settled, frozen in results:
        assert settled and frozen > 1000


def _conf_with_default(key: str, value: str):
    """A SparkConf constructor whose defaults hold ``key = value`` (as spark-submit --conf sets)."""
    from pyspark import SparkConf

    init = SparkConf.__init__

    def __init__(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self.set(key, value)

    return __init__


def test_every_context_keeps_a_short_status_history_unless_the_job_sets_one():
    """Spark's status store (kept for a UI localstate turns off) holds 100 jobs, not 1,000: a standing
    job starts several a second, and the driver reads a batch's failed attempts right after it."""
    from localstate.runtime.spark.context import STATUS_RETENTION

    conf = spark_conf("local[2]")
    assert {key: conf.get(key) for key in STATUS_RETENTION} == dict(STATUS_RETENTION)
    assert spark_conf("spark://127.0.0.1:7077").get("spark.ui.retainedJobs") == "100"
    assert spark_conf("local[2]", conf={"spark.ui.retainedJobs": "5000"}).get("spark.ui.retainedJobs") == "5000"


def test_a_worker_returns_free_memory_after_its_batches_at_most_once_a_second(spark_context):
    """``return_free_memory`` (called at every check-in) trims glibc's free memory in a Spark worker,
    throttled; outside a Spark task it does nothing."""
    from localstate.runtime.spark.affinity.kept import return_free_memory

    assert return_free_memory() is False  # the driver: not a Spark task

    def calls(_rows):
        yield [return_free_memory(), return_free_memory()]

    results = spark_context.parallelize([0], 1).mapPartitions(calls).collect()
    assert results == [[True, False]] or results == [[False, False]]
    # [False, False]: this reused worker trimmed less than a second ago in an earlier test's task.
    import time

    time.sleep(1.1)
    assert spark_context.parallelize([0], 1).mapPartitions(calls).collect() == [[True, False]]
