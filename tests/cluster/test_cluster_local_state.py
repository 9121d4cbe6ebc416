"""Cluster mode, executor side, without Spark: local state another job left on a host.

The likely cause of the flaky failure of ``test_worker_killed_mid_batch_moves_partitions_then_returns
[file]`` (issue 17: one partition's running counts too low, in a full-suite run only): every cluster
test runs a job named ``cluster-counts`` with ``local_dir`` on the session's per-host directories, so
a host holds the stores an *earlier test's job* left there. When a partition moves to such a host,
recovery by offsets alone sees a local offset at or below the new job's checkpoint and replays only
the tail after it, on top of the other job's state (at an offset of a different changelog). Local
state is trusted only if the committed checkpoint names the attempt that last wrote it
(``Checkpoint.attempt`` and the ``attempts/`` markers): a store another job, or an uncommitted
attempt, wrote is rebuilt. The first test here fails without that check (a running count of the
other job), as the flaky test did.

Each test runs the executor's code (``run_partition``) in this process; ``SPARK_LOCAL_DIRS`` says
which "host" it runs on, as Spark sets it for a Python worker.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from jobs import PARTITIONS, actual_outputs, expected_outputs, expected_state, restored_state, write_job  # noqa: E402

from localstate.core.checkpoint import Checkpoint  # noqa: E402
from localstate.core.config import load_job_config  # noqa: E402
from localstate.runtime.spark.runner import SparkJobRunner, run_partition  # noqa: E402

pytestmark = [pytest.mark.cluster]

BATCH = 600  # 4 batches of the 2400 events per partition


def _runner(directory: Path, batch: int = BATCH) -> tuple[object, SparkJobRunner]:
    """A cluster-mode job ``cluster-counts`` in ``directory`` (its own state and outputs) and its
    driver, never contacting the (absent) master."""
    job = load_job_config(write_job(directory, "spark://127.0.0.1:7077", state_dir=directory / "state"))
    runner = SparkJobRunner(job, context=object(), batch_size=batch, progress=None)
    runner.planner.initial_checkpoints()
    return job, runner


def _batch(job, runner: SparkJobRunner, batch: int) -> list[dict]:
    """Run ``batch`` on this "host" (this process) and commit it as the driver does."""
    plans, _ = runner.plan(batch)
    results = [run_partition(job, plan) for plan in plans]
    for result in results:
        assert "error" not in result, result
        checkpoint = Checkpoint(**result["checkpoint"])
        if runner.cluster:
            runner.planner.check_attempt(checkpoint)
        runner.checkpoints.save(checkpoint, expect_generation=checkpoint.generation)
    return results


def test_another_jobs_local_state_under_the_same_name_is_rebuilt(tmp_path, monkeypatch):
    """Host A keeps the stores of an earlier job with the same name (the whole input in one batch:
    another changelog, other offsets); the new job (batches of 300) moves to A after two batches on
    host B, where A's local offsets are at or below the new checkpoint. Replaying the tail after them
    on top of the earlier job's counts leaves the keys the tail does not touch at the earlier job's
    counts (what the flaky test saw: a running count of 17 where 23 was due). They must be rebuilt."""
    host_a, host_b = tmp_path / "host-a", tmp_path / "host-b"
    monkeypatch.setenv("SPARK_LOCAL_DIRS", str(host_a))
    earlier, earlier_runner = _runner(tmp_path / "earlier", batch=2400)
    left = _batch(earlier, earlier_runner, 0)  # leaves its stores on host A

    job, runner = _runner(tmp_path / "job", batch=300)
    monkeypatch.setenv("SPARK_LOCAL_DIRS", str(host_b))
    _batch(job, runner, 0)
    _batch(job, runner, 1)
    committed = {p: runner.checkpoints.load(p) for p in range(PARTITIONS)}
    # The trap: the other job's local offset is at or below this job's checkpoint, so offsets alone
    # would call the state "behind" and replay only the tail.
    assert all(Checkpoint(**r["checkpoint"]).changelogs["counts"] <= committed[r["partition"]].changelogs["counts"]
               for r in left)

    monkeypatch.setenv("SPARK_LOCAL_DIRS", str(host_a))
    moved = _batch(job, runner, 2)
    for result in moved:
        assert not result["warm"], result
        # Rebuilt from offset 0: every committed record replayed, not the tail after the other job's offset.
        assert result["replayed"] == committed[result["partition"]].changelogs["counts"], result
    batch = 3
    while runner.plan(batch)[0]:
        _batch(job, runner, batch)
        batch += 1
    assert batch == 8
    for partition in range(PARTITIONS):
        assert actual_outputs(job, partition) == expected_outputs(partition), f"partition {partition}"
    assert restored_state(job, tmp_path / "verify") == expected_state()


def test_a_host_returning_to_a_partition_it_left_rebuilds_it(tmp_path, monkeypatch):
    """Host A ran a partition, the partition moved to B for a batch, then back to A: A's local state
    is at an offset the changelog has passed, written by an attempt older than the committed one. The
    same job, the same changelog: rolling forward would be exact here, but A cannot know that its
    state is not a zombie's (see the module docstring), so it rebuilds; the result is exact."""
    host_a, host_b = tmp_path / "host-a", tmp_path / "host-b"
    job, runner = _runner(tmp_path / "job")
    monkeypatch.setenv("SPARK_LOCAL_DIRS", str(host_a))
    _batch(job, runner, 0)
    monkeypatch.setenv("SPARK_LOCAL_DIRS", str(host_b))
    _batch(job, runner, 1)
    monkeypatch.setenv("SPARK_LOCAL_DIRS", str(host_a))
    back = _batch(job, runner, 2)
    assert all(not r["warm"] and r["replayed"] > 0 for r in back)
    again = _batch(job, runner, 3)
    assert all(r["warm"] and r["replayed"] == 0 for r in again)  # and warm again on the next batch
    for partition in range(PARTITIONS):
        assert actual_outputs(job, partition) == expected_outputs(partition), f"partition {partition}"
    assert restored_state(job, tmp_path / "verify") == expected_state()


def test_local_mode_with_a_shared_local_dir_rebuilds_another_jobs_state(tmp_path):
    """The same trap on one machine: ``[job] local_dir`` (stores outside the state directory) shared
    by two jobs of the same name. Local mode needs no attempt ids for it: its one host opens every
    partition in the new job's first batch against an empty changelog, so the other job's stores are
    "ahead of the changelog" there and rebuilt, before any offset could line up."""
    def local_runner(directory: Path, batch: int) -> tuple[object, SparkJobRunner]:
        job = load_job_config(write_job(directory, "local[1]", state_dir=directory / "state",
                                        local_dir=str(tmp_path / "host")))
        return job, SparkJobRunner(job, context=object(), batch_size=batch, progress=None, keep_open=False)

    earlier, earlier_runner = local_runner(tmp_path / "earlier", 2400)
    _batch(earlier, earlier_runner, 0)  # the whole input: its stores stay in the shared local_dir
    job, runner = local_runner(tmp_path / "job", 300)
    batch = 0
    while runner.plan(batch)[0]:
        results = _batch(job, runner, batch)
        if batch == 0:  # the earlier job's stores were found and thrown away, not reused
            assert all(not r["warm"] for r in results)
        batch += 1
    for partition in range(PARTITIONS):
        assert actual_outputs(job, partition) == expected_outputs(partition), f"partition {partition}"
    assert restored_state(job, tmp_path / "verify") == expected_state()


def test_a_local_mode_run_in_between_invalidates_the_cluster_jobs_local_state(tmp_path):
    """A cluster job's stores sit on a host, named by its committed checkpoint; then a local-mode job
    of the same name, with the same ``local_dir``, rewrites those store directories (it names no
    attempts). When the cluster job goes on there, its state must not be taken as warm: an instance
    without an attempt id removes the attempt markers of the stores it opens."""
    def runner_for(directory: Path, master: str, batch: int) -> tuple[object, SparkJobRunner]:
        job = load_job_config(write_job(directory, master, state_dir=directory / "state",
                                        local_dir=str(tmp_path / "host")))
        runner = SparkJobRunner(job, context=object(), batch_size=batch, progress=None, keep_open=False)
        if runner.cluster:
            runner.planner.initial_checkpoints()
        return job, runner

    job, runner = runner_for(tmp_path / "job", "spark://127.0.0.1:7077", 600)
    _batch(job, runner, 0)
    other, other_runner = runner_for(tmp_path / "other", "local[1]", 300)
    _batch(other, other_runner, 0)
    back = _batch(job, runner, 1)
    assert all(not r["warm"] for r in back), back
    _batch(job, runner, 2)
    _batch(job, runner, 3)
    assert runner.plan(4)[0] == []
    for partition in range(PARTITIONS):
        assert actual_outputs(job, partition) == expected_outputs(partition), f"partition {partition}"
    assert restored_state(job, tmp_path / "verify") == expected_state()
