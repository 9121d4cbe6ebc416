"""Compaction while `localstate run` runs (runtime/spark/runner.py BatchCompaction): batches marked
``roll_changelogs`` seal the writers' active segments, a background round then compacts up to the
checkpoints, and a restore from the compacted changelog gives exactly the committed state."""

from __future__ import annotations

import shutil
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest

from localstate.changelog.file.format import list_segments
from localstate.core.checkpoint import Checkpoint
from localstate.core.config import load_job_config
from localstate.core.partitioner import partition_for
from localstate.runtime.layout import checkpoint_store, open_changelog_system, store_directory
from localstate.runtime.partition.instance import TaskInstance
from localstate.runtime.spark.affinity import kept as instances
from localstate.runtime.spark.runner import BatchCompaction, SparkJobRunner, run_partition
from counting_job import write_counting_job  # tests/ is on sys.path (tests/conftest.py)
from keyed_events import write_keyed_events

STREAM = "compacting-counts-changelog"
KEYS = [f"k{i % 5}" for i in range(400)]


@pytest.fixture(autouse=True)
def _nothing_kept():
    yield
    instances.release_kept()


def make_job(tmp_path: Path, interval: str | int) -> Path:
    """The counting job over ``KEYS``, its file changelogs compacted every ``interval`` (0: never)."""
    write_keyed_events(tmp_path / "data", KEYS)
    return write_counting_job(tmp_path, "compacting",
                              changelogs={"file": {"fsync": False, "compact_interval": interval}})


def changelog_offsets(job, partition: int) -> list[int]:
    return [r.offset for r in open_changelog_system(job).reader(STREAM, partition).read()]


def restored_counts(job) -> dict:
    counts = {}
    for partition in range(2):
        shutil.rmtree(store_directory(job, "counts", partition))
        instance = TaskInstance(job, partition, open_changelog_system(job))
        instance.open()
        counts.update(instance.stores["counts"].engine.all())
        instance.close(commit=False)
    return counts


def test_rolled_batch_then_round_compacts_the_committed_prefix(tmp_path):
    """The driver's steps by hand (no Spark): roll, commit, compact; then more batches and a restore."""
    job = load_job_config(make_job(tmp_path, "1h"))
    runner = SparkJobRunner(job, context=object(), batch_size=20, progress=None)
    compaction = BatchCompaction.for_job(job)
    assert compaction is not None and compaction.interval == 3600 and compaction.due()
    for batch in range(8):
        plans, _ = runner.plan(batch)
        roll = batch in (0, 5)
        for plan in plans:
            result = run_partition(job, replace(plan, roll_changelogs=roll))
            checkpoint = Checkpoint(**result["checkpoint"])
            checkpoint_store(job).save(checkpoint, expect_generation=checkpoint.generation)
        if roll:
            compaction.start_round()
            assert not compaction.due()  # once per interval
        if batch == 4:
            sealed = {p: checkpoint_store(job).load(p).changelogs["counts"] for p in range(2)}
    compaction.close()
    assert compaction.rounds.runs == 2 and compaction.rounds.last_error is None
    upto = {p: checkpoint_store(job).load(p).changelogs["counts"] for p in range(2)}
    directory = open_changelog_system(job).partition_dir(STREAM, 0)
    assert list_segments(directory)[0] > 0  # batch 5 sealed the writer's segment; the round emptied it
    for partition in range(2):
        offsets = changelog_offsets(job, partition)
        # Batches 0-4 (sealed by batch 5's roll) were compacted to one record per key; later
        # records are untouched.
        keys = {k for k in KEYS if partition_for(k, 2) == partition}
        assert len([o for o in offsets if o < sealed[partition]]) <= len(keys) < sealed[partition]
        assert [o for o in offsets if o >= sealed[partition]] == list(range(sealed[partition], upto[partition]))
    instances.release_kept()
    expected = {}
    for partition in range(2):
        mine = [k for k in KEYS if partition_for(k, 2) == partition][: 8 * 20]
        expected.update(Counter(mine))
    assert restored_counts(job) == expected


@pytest.mark.spark
def test_run_compacts_between_batches_and_restore_is_exact(tmp_path, spark_context):
    job = load_job_config(make_job(tmp_path, "1ms"))
    summary = SparkJobRunner(job, context=spark_context, batch_size=20, progress=None).run()
    assert summary.records_in == len(KEYS) and len(summary.batches) >= 8
    assert summary.compaction_rounds >= 2
    for partition in range(2):
        # How much the rounds (child processes, running beside the batches) removed depends on
        # timing, so only what holds whatever they reached is checked here: the changelog's offsets
        # are increasing, below the committed end; the test above checks by hand what one round
        # must leave, and the restore below that nothing a key needs was removed.
        writes = checkpoint_store(job).load(partition).changelogs["counts"]
        offsets = changelog_offsets(job, partition)
        assert offsets == sorted(set(offsets)) and offsets[-1] == writes - 1
    assert restored_counts(job) == dict(Counter(KEYS))


@pytest.mark.spark
def test_compaction_disabled_leaves_the_changelog_alone(tmp_path, spark_context):
    job = load_job_config(make_job(tmp_path, 0))
    summary = SparkJobRunner(job, context=spark_context, batch_size=40, progress=None).run()
    assert summary.compaction_rounds == 0
    for partition in range(2):
        writes = checkpoint_store(job).load(partition).changelogs["counts"]
        assert changelog_offsets(job, partition) == list(range(writes))
