"""Task instances kept open across batches in a Python worker (runtime/spark/affinity/kept.py): reused only
when the driver committed exactly their last batch, given back on request, all closed at run end."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections import Counter

import pytest

from localstate.core.checkpoint import Checkpoint
from localstate.core.config import load_job_config
from localstate.core.partitioner import partition_for
from localstate.runtime.layout import checkpoint_store, open_changelog_system
from localstate.runtime.partition.instance import TaskInstance
from localstate.runtime.spark.affinity import kept as instances
from localstate.runtime.spark.affinity.slots import WorkerAffinity
from localstate.runtime.spark.config import SparkConfig
from localstate.runtime.spark.runner import SparkJobRunner, run_partition, run_slot
from localstate.core.stream import open_output
from localstate.runtime.partition.sink import StreamSink

from counting_job import final_counts, write_counting_job  # tests/ is on sys.path (tests/conftest.py)
from keyed_events import write_keyed_events

from .test_spark_runtime import _bad_input_job

pytestmark = pytest.mark.spark


@pytest.fixture(autouse=True)
def _nothing_kept():
    yield
    instances.release_kept()


def _save(job, result) -> None:
    checkpoint = Checkpoint(**result["checkpoint"])
    checkpoint_store(job).save(checkpoint, expect_generation=checkpoint.generation)


def _emitted(job, partition: int) -> list:
    output = open_output(job, "counts-out")
    try:
        return list(output.read(partition))
    finally:
        output.close()


def test_kept_instance_is_reused_only_after_its_batch_was_committed(tmp_path):
    job = load_job_config(_bad_input_job(tmp_path, "skip"))
    runner = SparkJobRunner(job, context=object(), batch_size=10, progress=None)  # plans only
    [plan] = [p for p in runner.plan(0)[0] if p.partition == 0]
    assert plan.keep_open

    first = run_partition(job, plan)                     # prepared, kept open, never committed
    assert not first["reused"] and instances._kept is not None
    again = run_partition(job, plan)                     # the retry must not build on `first`
    assert not again["reused"] and again["trimmed"] > 0
    assert again["checkpoint"]["inputs"] == first["checkpoint"]["inputs"]
    assert again["checkpoint"]["generation"] == first["checkpoint"]["generation"] + 1
    _save(job, again)                                    # the driver commits the batch

    [plan] = [p for p in runner.plan(1)[0] if p.partition == 0]
    reused = run_partition(job, plan)
    assert reused["reused"] and reused["restore_seconds"] == 0 and reused["trimmed"] == 0
    assert reused["checkpoint"]["generation"] == again["checkpoint"]["generation"]
    assert reused["timings"]["open"] < 1.0 and reused["timings"]["wait"] == 0.0
    _save(job, reused)

    # Every emitted running count is exactly one more than the key's previous one: no batch was
    # applied twice, none lost.
    seen: Counter = Counter()
    for key, count in _emitted(job, 0):
        assert count == seen[key] + 1, (key, count, seen[key])
        seen[key] = count
    assert sum(seen.values()) == 20


def test_kept_instance_of_another_run_or_partition_is_closed_not_reused(tmp_path):
    job = load_job_config(_bad_input_job(tmp_path, "skip"))
    runner = SparkJobRunner(job, context=object(), batch_size=10, progress=None)
    plans = {p.partition: p for p in runner.plan(0)[0]}
    _save(job, run_partition(job, plans[0]))
    _save(job, run_partition(job, plans[1]))             # this worker now keeps partition 1 only
    assert instances._kept.instance.partition == 1
    runner.run_id = "another run"
    plans = {p.partition: p for p in runner.plan(1)[0]}
    result = run_partition(job, plans[1])                # committed, but kept by an earlier run
    assert not result["reused"]


def test_kept_instance_is_given_back_on_request(tmp_path):
    job = load_job_config(_bad_input_job(tmp_path, "skip"))
    runner = SparkJobRunner(job, context=object(), batch_size=10, progress=None)
    [plan] = [p for p in runner.plan(0)[0] if p.partition == 1]
    _save(job, run_partition(job, plan))
    assert instances._kept is not None
    # Another instance wants the partition: the watcher thread closes the kept one.
    store = checkpoint_store(job)
    waited = instances.acquire_partition(store, 1, timeout=10)
    assert instances._kept is None and waited < 10
    assert not (store.root / "1.want").exists()
    store.unlock(1)


def test_a_run_leaves_no_instance_open(tmp_path, spark_context):
    job = load_job_config(_bad_input_job(tmp_path, "skip"))
    summary = SparkJobRunner(job, context=spark_context, batch_size=8, progress=None).run()
    assert len(summary.batches) > 2 and sum(b.tasks for b in summary.batches) >= 2 * len(summary.batches) - 1
    assert final_counts(job) == dict(Counter(f"k{i % 7}" for i in range(60)))
    # The driver (or anyone) can open every partition right away: the workers gave them back.
    changelogs = open_changelog_system(job)
    for partition in range(job.partitions):
        instance = TaskInstance(job, partition, changelogs, StreamSink(job))
        instance.open()
        instance.close(commit=False)
    changelogs.close()


def _skewed_job(tmp_path, per_partition: tuple[int, int]):
    """A 2-partition counting job whose partitions get ``per_partition`` events."""
    keys = [f"k{i}" for i in range(2000)]
    mine = [[k for k in keys if partition_for(k, 2) == p][:n] for p, n in enumerate(per_partition)]
    write_keyed_events(tmp_path / "data", [k for part in mine for k in part])
    return load_job_config(write_counting_job(tmp_path, "skewed", events={"on_misrouted": "allow"}))


def test_a_partition_stays_with_its_worker_when_a_batch_has_fewer_partitions_than_workers(tmp_path, spark_context):
    """Spark hands a task to the worker idle the longest; with one slot per planned partition, the
    single-partition batches of this job (partition 1's input ends after the first batch) went to the
    two workers in turn and reopened partition 0 every batch. The driver now adds a spare slot per
    idle worker, so the keeper gets one and claims its partition."""
    job = _skewed_job(tmp_path, (120, 10))
    summary = SparkJobRunner(job, context=spark_context, batch_size=10, progress=None).run()
    single = [b for b in summary.batches if b.tasks == 1]
    assert len(single) == 11 and summary.batches[0].tasks == 2
    # Every single-partition batch finds partition 0 open in its worker (a loaded machine may let a
    # keeper's slot start later than its grace period: then that batch reopens, nothing else).
    assert sum(b.reused for b in single) >= 8, [b.reused for b in single]
    assert final_counts(job) == {k: 1 for k in final_counts(job)} and len(final_counts(job)) == 130


def test_spare_slot_claims_nothing_when_every_partition_is_claimed(tmp_path):
    claims = tmp_path / "checkpoints" / "claims" / "run" / "0"
    (tmp_path / "checkpoints").mkdir()
    assert instances.claim(claims, [3], 0, None) == 3
    assert instances.claim(claims, [3], 1, None) is None           # a spare slot: nothing to run
    assert instances.claim(claims, [3], 0, None) == 3              # a retried attempt continues


def test_slot_leaves_a_partition_to_its_live_keeper_then_takes_it_over(tmp_path):
    claims = tmp_path / "checkpoints" / "claims" / "run" / "0"
    (tmp_path / "checkpoints").mkdir()
    keeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        # The keeper's slot claims its partition while the other slot waits: the other runs nothing.
        threading.Timer(0.05, instances.claim, (claims, [0, 1], 1, 1)).start()
        assert instances.claim(claims, [1], 0, None, keepers={1: keeper.pid}, grace=5.0) is None
        assert instances.claimed_by(claims, 1) == [1]
        # A partition nobody keeps is claimed at once, before one a live worker keeps.
        started = time.monotonic()
        assert instances.claim(claims, [2, 0], 2, None, keepers={2: keeper.pid}, grace=5.0) == 0
        assert time.monotonic() - started < 2.5
        # Partition 2's keeper never claims it: taken over once the grace period ends.
        started = time.monotonic()
        assert instances.claim(claims, [2], 3, None, keepers={2: keeper.pid}, grace=0.2) == 2
        assert time.monotonic() - started >= 0.2
    finally:
        keeper.kill()
        keeper.wait()
    # A keeper that is gone is not waited for.
    started = time.monotonic()
    assert instances.claim(claims, [5], 4, None, keepers={5: keeper.pid}, grace=30.0) == 5
    assert time.monotonic() - started < 5.0


def test_driver_records_the_last_partition_each_worker_ran_as_the_one_it_keeps(tmp_path):
    """A worker keeps only the last partition it ran: with more partitions than cores one worker runs
    two in a batch, and an entry naming the first would make a slot wait for a keeper that no longer
    keeps it. A spare slot that ran nothing changes nothing."""

    class Context:  # WorkerAffinity asks the context only for its parallelism here
        defaultParallelism = 2

    affinity = WorkerAffinity(Context(), tmp_path / "claims", run_slot)
    affinity.keepers = {2: 11, 3: 12}
    affinity.record([{"partition": 0, "pid": 10, "finished": 1.0},
                     {"partition": 1, "pid": 11, "finished": 1.5},
                     {"partition": 2, "pid": 10, "finished": 2.0},
                     {"partition": None, "pid": 12, "attempt": 0}])
    assert affinity.keepers == {1: 11, 2: 10, 3: 12}


def test_without_worker_affinity_every_batch_opens_its_partitions_and_counts_stay_exact(tmp_path, spark_context):
    """``[spark] worker_affinity = false``: the plain path (plan -> one task per partition -> save):
    nothing is kept open between batches, no slot claims anything, and the state is the same."""
    path = _bad_input_job(tmp_path, "skip")
    path.write_text(path.read_text() + "\n[spark]\nworker_affinity = false\n")
    job = load_job_config(path)
    assert SparkConfig.of(job).affinity_setting is False
    runner = SparkJobRunner(job, context=spark_context, batch_size=8, progress=None)
    assert not runner.keep_open
    assert all(not plan.keep_open for plan in runner.plan(0)[0])
    summary = runner.run()
    assert len(summary.batches) > 2
    assert sum(b.reused for b in summary.batches) == 0            # every batch reopened its partitions
    assert final_counts(job) == dict(Counter(f"k{i % 7}" for i in range(60)))
    assert not (runner.checkpoints.root / "claims").exists()                 # no slot ever claimed a partition


def test_worker_affinity_is_on_by_default_on_local_masters_only(tmp_path):
    job = load_job_config(_bad_input_job(tmp_path, "skip"))
    assert SparkConfig.of(job, master="local[2]").worker_affinity
    assert SparkConfig.of(job, master="local[2,4]").worker_affinity
    assert not SparkConfig.of(job, master="spark://127.0.0.1:7077").worker_affinity
    assert SparkJobRunner(job, context=object(), progress=None).keep_open
