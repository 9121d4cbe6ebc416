"""State as data on the objectstore changelog, on a shared directory and on S3 (SeaweedFS): the
epoch pointer and the epochs' checkpoints live in the durable storage; a savepoint read from the
snapshots and deltas the checkpoints name (and kept on S3 itself); a rescale (by that savepoint, or
reading the committed state in place), then running on, gives the state of the job run with the new
count from the start; garbage collection keeps what the new
epoch's checkpoints name; ``reset --old-epochs`` removes the old epoch's objects and nothing else."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from rescale_model import ModelRun, committed_state, model_job  # noqa: E402

from localstate.runtime.layout import open_changelog_system, read_epoch, resolve_epoch
from localstate.runtime.statedata.location import SavepointLocation, storage_options
from localstate.runtime.statedata.reader import Savepoint
from localstate.runtime.statedata.rescale import rescale

RECORDS = [(f"user-{i % 17}", i, float(i % 90)) for i in range(80)]
MORE = [(f"user-{(i * 5) % 23}", i, float(50 + i % 40)) for i in range(40)]


def run_records(root: Path, partitions: int, options: dict[str, Any]) -> tuple[Any, ModelRun]:
    """The model job on the objectstore changelog at ``options``, RECORDS fed 20 at a time, each
    batch committed (snapshots and deltas in the chains), event time at 50; the run still open."""
    job = model_job(root, partitions, changelog="objectstore", changelog_options=options)
    run = ModelRun(job)
    for start in range(0, len(RECORDS), 20):
        run.feed(RECORDS[start:start + 20])
        run.driver.commit()
    run.event_time(50.0)
    return job, run


def reference_options(tmp_path: Path, options: dict[str, Any]) -> dict[str, Any]:
    """Another location on the same storage, for the job run with the new count from the start."""
    if options["url"].startswith("s3://"):
        return {**options, "url": options["url"] + "-ref"}
    return {**options, "url": str(tmp_path / "reference" / "shared")}


def test_rescale_on_the_objectstore_changelog_with_a_savepoint_on_the_same_storage(
        tmp_path: Path, objectstore_options: dict[str, Any]) -> None:
    options = {**objectstore_options, "snapshot_every": 2}  # snapshots in the chains the savepoint reads
    job, run = run_records(tmp_path, 2, options)
    now = run.close()
    url = options["url"] + "-savepoint" if options["url"].startswith("s3://") else str(tmp_path / "savepoint")
    kept = SavepointLocation(storage_options(url, job))  # an s3:// savepoint takes the job's S3 options
    rescale(resolve_epoch(job), 3, savepoint_to=kept)
    assert Savepoint.open(kept).manifest.partitions == 2
    pointer = read_epoch(job)
    assert (pointer.epoch, pointer.partitions) == (1, 3)
    assert not (tmp_path / "model" / "epoch.json").exists()  # the pointer is a job object in durable storage

    rescaled = model_job(tmp_path, 3, changelog="objectstore", changelog_options=options)
    after = ModelRun(rescaled, now=now)
    after.feed(MORE)
    now = after.close()
    expected_job, expected = run_records(tmp_path / "reference", 3, reference_options(tmp_path, options))
    expected.feed(MORE)
    assert committed_state(rescaled, expected.close()) == committed_state(expected_job, now)

    # garbage collection keeps every object the current epoch's checkpoints name
    system = open_changelog_system(resolve_epoch(rescaled))
    try:
        for config in resolve_epoch(rescaled).stores.values():
            if config.changelog:
                system.collect_garbage(config.changelog, now=10 ** 12)
    finally:
        system.close()
    assert committed_state(rescaled, now) == committed_state(expected_job, now)

    # reset --old-epochs: epoch 0's checkpoints and streams go, the current epoch stays
    from localstate.runtime.statedata.epochs import old_epoch_places

    old_epoch_places(resolve_epoch(rescaled)).delete()
    system = open_changelog_system(job)
    try:
        assert system.checkpoint_objects("model").latest(0) is None
        assert system.objects("model-counts-changelog", 0) == []
        assert system.objects("model-counts-changelog.e1", 0) != []
    finally:
        system.close()
    assert committed_state(rescaled, now) == committed_state(expected_job, now)


def test_rescale_on_the_objectstore_changelog_reads_the_committed_state_in_place(
        tmp_path: Path, objectstore_options: dict[str, Any]) -> None:
    """No --savepoint: the snapshots and deltas the checkpoints name are read in place, the keys
    routed into the new epoch's objects; the state equals the job's run with 3 partitions."""
    options = {**objectstore_options, "snapshot_every": 2}
    job, run = run_records(tmp_path, 2, options)
    now = run.close()
    rescale(resolve_epoch(job), 3)
    pointer = read_epoch(job)
    assert (pointer.epoch, pointer.partitions, pointer.previous) == (1, 3, 0)
    assert not (tmp_path / "model" / "savepoints").exists()  # nothing staged on the way
    expected_job, expected = run_records(tmp_path / "reference", 3, reference_options(tmp_path, options))
    rescaled = model_job(tmp_path, 3, changelog="objectstore", changelog_options=options)
    assert committed_state(rescaled, now) == committed_state(expected_job, expected.close())
