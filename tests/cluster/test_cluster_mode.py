"""Cluster mode without a cluster: the driver's plans and commits and the executor's side
(``run_partition`` with a cluster plan) in this process, on real stores and the file changelog.

- the plan carries the committed checkpoint; the executor reads no checkpoint file, writes none and
  takes no lock, and keeps its stores under its Spark local directory, not in the state directory;
- a task finds its state warm when its local stores are at the committed offsets; a host without
  them restores; a host whose local state is *ahead* of the committed checkpoint (a zombie's or a
  failed attempt's writes) discards it: the outputs and the state stay exact;
- the driver refuses an attempt that did not start from the checkpoint it planned;
- ``[job] local_dir`` and the cluster warning of ``localstate run``.
"""

from __future__ import annotations

import shutil
import sys
from dataclasses import replace
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from jobs import PARTITIONS, actual_outputs, expected_outputs, expected_state, restored_state, write_job  # noqa: E402

from localstate.core.checkpoint import Checkpoint  # noqa: E402
from localstate.core.config import load_job_config, parse_job_config  # noqa: E402
from localstate.runtime.layout import store_root
from localstate.runtime.spark.cluster import executor_local_root, is_cluster_master  # noqa: E402
from localstate.runtime.spark.runner import SparkJobRunner, run_partition  # noqa: E402
from localstate.tools.validation import spark_notes  # noqa: E402
from localstate.errors import ConfigError, FencedError  # noqa: E402

BATCH = 800  # 3 batches of the 2400 events per partition


@pytest.fixture
def cluster_job(tmp_path, monkeypatch):
    """A job on a (never contacted) standalone master, its runner, and this process as "the executor"
    with its Spark local directory."""
    monkeypatch.setenv("SPARK_LOCAL_DIRS", str(tmp_path / "executor-local"))
    job = load_job_config(write_job(tmp_path / "job", "spark://127.0.0.1:7077", state_dir=tmp_path / "state"))
    runner = SparkJobRunner(job, context=object(), batch_size=BATCH, progress=None)
    runner.planner.initial_checkpoints()
    return job, runner


def _commit(runner: SparkJobRunner, results: list[dict]) -> None:
    """What the driver does with the accepted attempts' results."""
    for result in results:
        assert "error" not in result, result
        checkpoint = Checkpoint(**result["checkpoint"])
        runner.planner.check_attempt(checkpoint)
        runner.checkpoints.save(checkpoint, expect_generation=checkpoint.generation)


def _run_batch(job, runner, batch: int) -> list[dict]:
    plans, _ = runner.plan(batch)
    return [run_partition(job, plan) for plan in plans]


def test_plan_carries_the_checkpoint_and_the_executor_writes_none(cluster_job, tmp_path):
    job, runner = cluster_job
    assert runner.cluster and not runner.keep_open
    checkpoints = tmp_path / "state" / "cluster-counts" / "checkpoints"
    before = {p.name: p.read_bytes() for p in checkpoints.iterdir()}
    assert sorted(before) == [f"{p}.json" for p in range(PARTITIONS)]  # the driver's first checkpoints
    plans, _ = runner.plan(0)
    assert all(plan.cluster for plan in plans)
    assert [Checkpoint(**plan.committed) for plan in plans] == [runner.checkpoints.load(p) for p in range(PARTITIONS)]
    results = [run_partition(job, plan) for plan in plans]
    assert all("error" not in r for r in results), results
    # The executor wrote no checkpoint and took no lock: the directory is byte for byte the same.
    assert {p.name: p.read_bytes() for p in checkpoints.iterdir()} == before
    # Stores in the executor's local directory, none in the state directory.
    local = tmp_path / "executor-local" / "localstate" / "cluster-counts" / "stores" / "counts"
    assert sorted(p.name for p in local.iterdir()) == [str(p) for p in range(PARTITIONS)]
    assert not (tmp_path / "state" / "cluster-counts" / "stores").exists()
    _commit(runner, results)
    assert [runner.checkpoints.load(p).generation for p in range(PARTITIONS)] == [1] * PARTITIONS


def test_warm_reuse_restore_and_ahead_local_state_are_exact(cluster_job, tmp_path, monkeypatch):
    job, runner = cluster_job
    _commit(runner, _run_batch(job, runner, 0))
    warm = _run_batch(job, runner, 1)
    assert all(r["warm"] and r["replayed"] == 0 for r in warm)
    # Batch 1 is not committed (its driver lost it, or a zombie ran it): partition 0's local state and
    # changelog are now ahead of the committed checkpoint.
    plans, _ = runner.plan(1)
    again = run_partition(job, plans[0])
    assert again["warm"] is False and again["trimmed"] > 0  # ahead: the uncommitted records undone
    _commit(runner, [again] + [run_partition(job, plan) for plan in plans[1:]])
    # Another host, with no local state, takes over: it restores from the changelog.
    monkeypatch.setenv("SPARK_LOCAL_DIRS", str(tmp_path / "other-host"))
    moved = _run_batch(job, runner, 2)
    assert all(not r["warm"] and r["replayed"] > 0 for r in moved)
    _commit(runner, moved)
    assert runner.plan(3)[0] == []
    for partition in range(PARTITIONS):
        assert actual_outputs(job, partition) == expected_outputs(partition)
    assert restored_state(job, tmp_path / "verify") == expected_state()


def test_driver_refuses_an_attempt_from_another_checkpoint(cluster_job):
    job, runner = cluster_job
    plans, _ = runner.plan(0)
    result = run_partition(job, plans[0])
    stale = Checkpoint(**result["checkpoint"])
    with pytest.raises(FencedError) as info:
        runner.planner.check_attempt(replace(stale, generation=stale.generation + 5))
    assert "partition 0" in str(info.value)


def test_local_dir_is_per_host_and_validated(tmp_path, monkeypatch):
    base = {"name": "j", "partitions": 1, "task": "m:T", "state_dir": str(tmp_path / "s")}
    with pytest.raises(ConfigError) as info:
        parse_job_config({"job": {**base, "local_dir": "relative/dir"}}, base_dir=tmp_path)
    assert "job.local_dir" in str(info.value)
    job = parse_job_config({"job": {**base, "local_dir": "${HOST_SSD}/ls"}}, base_dir=tmp_path)
    monkeypatch.setenv("HOST_SSD", str(tmp_path / "ssd"))
    assert store_root(job) == tmp_path / "ssd" / "ls" == executor_local_root(job)
    default = parse_job_config({"job": base}, base_dir=tmp_path)
    assert store_root(default) == tmp_path / "s"  # local mode: as always
    monkeypatch.setenv("SPARK_LOCAL_DIRS", f"{tmp_path / 'a'},{tmp_path / 'b'}")
    assert executor_local_root(default) == tmp_path / "a" / "localstate"


def test_cluster_master_and_file_changelog_warning(tmp_path):
    job = load_job_config(write_job(tmp_path / "job", "local[2]", state_dir=tmp_path / "state"))
    assert not is_cluster_master("local[2]") and is_cluster_master("spark://h:7077") and is_cluster_master("yarn")
    assert not any("cluster" in note for note in spark_notes(job, "local[2]"))
    notes = [note for note in spark_notes(job, "spark://h:7077") if note.startswith("job.changelog")]
    assert len(notes) == 1 and str(tmp_path / "state") in notes[0] and "docs/cluster.md" in notes[0]


def test_fresh_partition_with_changelog_records_but_no_checkpoint_is_refused(cluster_job, tmp_path):
    job, runner = cluster_job
    _commit(runner, _run_batch(job, runner, 0))
    shutil.rmtree(tmp_path / "state" / "cluster-counts" / "checkpoints")
    runner = SparkJobRunner(job, context=object(), batch_size=BATCH, progress=None)
    with pytest.raises(Exception) as info:
        runner.planner.initial_checkpoints()
    assert type(info.value).__name__ == "CheckpointError" and "checkpoint is missing" in str(info.value)


def test_local_state_of_an_attempt_that_was_not_committed_is_rebuilt(cluster_job, tmp_path, monkeypatch):
    """Host A runs batch 1 but its attempt is not the one committed (host B's attempt of the same batch
    is): when the partitions come back to A, A's local state is not trusted, whatever its offsets, and
    is rebuilt from the changelog; the result is exact."""
    job, runner = cluster_job
    _commit(runner, _run_batch(job, runner, 0))
    plans, _ = runner.plan(1)
    on_a = [run_partition(job, plan) for plan in plans]  # host A: written locally, never committed
    assert all("error" not in r for r in on_a)
    monkeypatch.setenv("SPARK_LOCAL_DIRS", str(tmp_path / "host-b"))
    on_b = [run_partition(job, plan) for plan in plans]
    _commit(runner, on_b)
    committed = {p: runner.checkpoints.load(p) for p in range(PARTITIONS)}
    assert all(c.attempt and c.attempt != Checkpoint(**a["checkpoint"]).attempt
               for c, a in zip(committed.values(), on_a))
    monkeypatch.setenv("SPARK_LOCAL_DIRS", str(tmp_path / "executor-local"))  # back on host A
    back = _run_batch(job, runner, 2)
    for result, partition in zip(back, range(PARTITIONS)):
        assert not result["warm"]
        # Rebuilt from offset 0: every committed changelog record replayed, not only the tail after A's offset.
        assert result["replayed"] == sum(committed[partition].changelogs.values()), result
    _commit(runner, back)
    batch = 3
    while (plans := runner.plan(batch)[0]):
        _commit(runner, [run_partition(job, plan) for plan in plans])
        batch += 1
    for partition in range(PARTITIONS):
        assert actual_outputs(job, partition) == expected_outputs(partition)
    assert restored_state(job, tmp_path / "verify") == expected_state()
