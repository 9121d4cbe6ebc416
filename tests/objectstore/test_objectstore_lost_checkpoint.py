"""A partition of the ``objectstore`` changelog whose checkpoint was lost does not start empty
(docs/durable.md, "A lost checkpoint"). Through the real runtime (kv on RocksDB, jsonl outputs), on a
shared directory and on SeaweedFS S3:

* a checkpoint that lost one store's entry (offset and manifest) is refused the same way, and the
  complete checkpoint gives the exact state;
* checkpoints deleted after some commits: the open is refused with a typed CheckpointError naming the
  store, stream, partition, prefix and object count, and so is the Spark driver's initial checkpoint
  (cluster mode); nothing in storage changes (garbage collection included), and putting the
  checkpoints back gives the exact state;
* a real child process SIGKILLed before its first commit's checkpoint was saved (its delta written):
  the restart is not refused and is exactly-once — the open-time checkpoint names the empty chain;
* ``localstate reset`` clears such a partition: the next start is empty, without an error;
* the listing costs one request per stream partition on a fresh open and none when a checkpoint exists;
* garbage collection leaves such a partition whole and still collects the others.
"""

from __future__ import annotations

import json
import shutil
import signal
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from localstate.changelog.objectstore.storage import ObjectStore
from localstate.tools.cli import main
from localstate.core.config import JobConfig, load_job_config
from localstate.runtime.layout import checkpoint_store, open_changelog_system
from localstate.runtime.partition.instance import TaskInstance
from localstate.runtime.spark.runner import SparkJobRunner
from localstate.runtime.partition.sink import StreamSink
from localstate.errors import CheckpointError

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from pipelined_job import STREAM, CountingTask, feed_until, open_instance  # noqa: E402
from test_objectstore_checkpoint_saves import CountingStore  # noqa: E402
from test_objectstore_commands import job_toml as commands_job, run_job as run_commands_job  # noqa: E402
from test_objectstore_pipelined import COMMIT_EVERY, assert_exact, committed, run_child, state  # noqa: E402

PREFIX = f"changelogs/{STREAM}/0"
CHECKPOINTS = "jobs/pipelined/checkpoints/0"


def job_file(root: Path, options: dict[str, Any]) -> JobConfig:
    """The job of ``pipelined_job.job`` as a job file (``localstate reset`` reads one), loaded."""
    root.mkdir(parents=True, exist_ok=True)
    changelog = "\n".join(f"{key} = {json.dumps(value)}" for key, value in options.items())
    (root / "job.toml").write_text(f"""
[job]
name = "pipelined"
partitions = 1
task = "pipelined_job:CountingTask"
changelog = "objectstore"
commit_every = {COMMIT_EVERY}
commit_interval = 1000000000
state_dir = "state"

[outputs.counts-out]
system = "jsonl"
path = "out"

[stores.counts]
engine = "kv"
backend = "rocksdb"
key_serde = "string"
value_serde = "int"

[changelogs.objectstore]
{changelog}
""")
    return load_job_config(root / "job.toml")


def storage(config: JobConfig) -> ObjectStore:
    return open_changelog_system(config).store  # type: ignore[attr-defined]


def listing(store: ObjectStore, prefix: str) -> dict[str, int]:
    return {info.key: info.size for info in store.list(prefix)}


def lose_checkpoints(store: ObjectStore) -> dict[str, bytes]:
    """Delete the partition's checkpoint objects (as an operator's mistake or a lost prefix would);
    returns them, as a backup holds them."""
    backup = {info.key: store.get(info.key) for info in store.list(CHECKPOINTS)}
    assert backup
    for key in backup:
        store.delete(key)
    return backup


def committed_run(root: Path, options: dict[str, Any], records: int) -> JobConfig:
    """Run the counting job up to ``records`` (a commit every COMMIT_EVERY, snapshots every 2) and
    close it once a snapshot is written: the committed chain is a snapshot plus deltas."""
    config = job_file(root, {**options, "snapshot_every": 2})
    instance = open_instance(config)
    feed_until(instance, records)
    instance.stores["counts"].changelog.wait_for_snapshot()
    instance.close()  # its checkpoint names the snapshot
    assert committed(config).inputs == {"in": records}
    assert committed(config).manifests["counts"]["snapshot"] is not None
    return config


def test_a_lost_checkpoint_is_refused_and_restoring_it_gives_the_exact_state(objectstore_options, tmp_path):
    records = 5 * COMMIT_EVERY
    config = committed_run(tmp_path, objectstore_options, records)
    store = storage(config)
    before = listing(store, PREFIX)
    deltas = [key for key in before if key.endswith(".delta")]
    assert deltas and any(key.endswith(".snapshot") for key in before)
    backup = lose_checkpoints(store)

    with pytest.raises(CheckpointError) as info:
        open_instance(config)
    error = info.value
    where = store.where(PREFIX)
    assert error.context["partition"] == 0 and error.context["store"] == "counts"
    assert error.context["stream"] == STREAM and error.context["path"] == where
    assert error.context["objects"] == len(before)
    assert error.context["checkpoint"] == f"{store.where('jobs/pipelined/checkpoints')}/0"
    assert f"holds {len(before)} object(s)" in str(error) and where in str(error)
    assert "the checkpoint is missing" in str(error)
    assert "localstate reset" in error.hint and "versioning" in error.hint
    # The refusal wrote nothing: no checkpoint of a new generation, no object, nothing deleted.
    assert listing(store, CHECKPOINTS) == {} and listing(store, PREFIX) == before
    # The Spark driver refuses it the same way before giving a partition its initial checkpoint
    # (cluster mode), and saves none.
    runner = SparkJobRunner(config, context=object(), master="spark://cluster:7077", progress=None)
    with pytest.raises(CheckpointError, match="the checkpoint is missing") as refused:
        runner.planner.initial_checkpoints()
    assert refused.value.context["path"] == where and refused.value.context["objects"] == len(before)
    assert listing(store, CHECKPOINTS) == {}
    # Garbage collection does not destroy the evidence, however old the objects are.
    system = open_changelog_system(config)
    stats = system.collect_garbage(STREAM, now=time.time() + 10 ** 6)
    assert stats.segments_deleted == 0 and listing(store, PREFIX) == before
    system.close()

    for key, data in backup.items():  # restored from the backup / the bucket's versioning
        store.put(key, data)
    instance = open_instance(config)
    assert_exact(instance, tmp_path, records)
    instance.close(commit=False)


def test_a_checkpoint_that_lost_a_stores_entry_is_refused(objectstore_options, tmp_path):
    """Partial loss: the checkpoint is there but names neither an offset nor a manifest for the
    store, whose objects exist. The open is refused (starting the store empty would drop its
    committed state) and writes nothing; the complete checkpoint gives the exact state again."""
    records = 5 * COMMIT_EVERY
    config = committed_run(tmp_path, objectstore_options, records)
    store = storage(config)
    before = listing(store, PREFIX)
    complete = {info.key: store.get(info.key) for info in store.list(CHECKPOINTS)}
    assert complete
    for key, data in complete.items():
        damaged = json.loads(data)
        damaged["changelogs"].pop("counts")
        damaged["manifests"].pop("counts")
        store.put(key, json.dumps(damaged).encode())
    damaged_listing = listing(store, CHECKPOINTS)

    with pytest.raises(CheckpointError) as info:
        open_instance(config)
    error = info.value
    assert error.context["store"] == "counts" and error.context["partition"] == 0
    assert error.context["path"] == store.where(PREFIX) and error.context["objects"] == len(before)
    assert "names no changelog offset for store 'counts'" in str(error) and "localstate reset" in error.hint
    assert listing(store, CHECKPOINTS) == damaged_listing and listing(store, PREFIX) == before

    for key, data in complete.items():
        store.put(key, data)
    instance = open_instance(config)
    assert_exact(instance, tmp_path, records)
    instance.close(commit=False)


def test_a_crash_before_the_first_commits_checkpoint_restarts_exactly(objectstore_options, tmp_path):
    records = 3 * COMMIT_EVERY
    killed = run_child(tmp_path, objectstore_options, records, crash="commit_pending:1")
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    assert "done" not in killed.stdout
    config = job_file(tmp_path, objectstore_options)
    # What the crash left: the first commit's delta, written, and no checkpoint naming it — only the
    # one the instance saved at open (generation 1), naming the empty chain.
    first = committed(config)
    assert first.generation == 1 and first.inputs == {} and first.manifests["counts"]["end"] == 0
    orphans = listing(storage(config), PREFIX)
    assert [key for key in orphans if key.endswith(".delta")], orphans
    instance = open_instance(config)  # not refused: the partition never committed a record
    assert_exact(instance, tmp_path, 0)
    instance.close(commit=False)
    finished = run_child(tmp_path, objectstore_options, records)
    assert finished.returncode == 0, finished.stderr[-3000:]
    final = open_instance(config)
    assert_exact(final, tmp_path, records)
    final.close(commit=False)


def test_reset_clears_a_partition_whose_checkpoint_was_lost(objectstore_options, tmp_path, capsys):
    config = committed_run(tmp_path, objectstore_options, 3 * COMMIT_EVERY)
    store = storage(config)
    lose_checkpoints(store)
    with pytest.raises(CheckpointError):
        open_instance(config)
    assert main(["reset", str(tmp_path / "job.toml"), "--yes"]) == 0
    assert f"changelog {STREAM!r}" in capsys.readouterr().out
    assert listing(store, PREFIX) == {} and listing(store, CHECKPOINTS) == {}
    shutil.rmtree(tmp_path / "out")  # reset never deletes the job's outputs: the operator moves them away
    instance = open_instance(config)
    assert instance.position("in") == 0 and state(instance) == {}
    feed_until(instance, COMMIT_EVERY)  # and it runs from scratch
    instance.close()
    assert committed(config).inputs == {"in": COMMIT_EVERY}
    instance.close(commit=False)


def counted_open(config: JobConfig) -> tuple[TaskInstance, CountingStore]:
    """Partition 0 opened with every request to the storage (changelog and checkpoints) counted."""
    system = open_changelog_system(config)
    counting = system.store = CountingStore(system.store)  # type: ignore[attr-defined]
    checkpoints = checkpoint_store(config)
    checkpoints.objects.store = counting  # type: ignore[union-attr]
    instance = TaskInstance(config, 0, system, StreamSink(config), CountingTask, checkpoints=checkpoints)
    instance.open()
    return instance, counting


def test_the_listing_is_one_request_on_a_fresh_open_and_none_with_a_checkpoint(objectstore_options, tmp_path):
    config = job_file(tmp_path, {**objectstore_options, "compactor": "thread"})
    instance, fresh = counted_open(config)  # an empty prefix: no error
    # On the changelog: the stream's metadata (read, created, read by partition()) and the one listing.
    assert fresh.on(PREFIX) == Counter({"list": 1})
    assert fresh.on("changelogs/") == Counter({"get": 2, "put": 1, "list": 1})
    feed_until(instance, 2 * COMMIT_EVERY)
    instance.close()
    instance, reopened = counted_open(config)  # a checkpoint exists: the changelog prefix is not listed
    # Only the stream's metadata (ensure_stream, partition()): what an open cost before the check
    # existed; the warm local store reads no object of the chain.
    assert reopened.on("changelogs/") == Counter({"get": 2})
    assert all(kind != "list" or key.startswith("jobs/") for kind, key in reopened.log)
    assert_exact(instance, tmp_path, 2 * COMMIT_EVERY)
    instance.close(commit=False)


def test_garbage_collection_skips_only_the_partition_no_checkpoint_mentions(objectstore_options, tmp_path):
    # Two partitions, superseded deltas and snapshots in both; partition 0's checkpoints are lost.
    path = commands_job(tmp_path, {**objectstore_options, "snapshot_every": 2, "gc_keep": 1})
    run_commands_job(path, [f"u{i % 9}" for i in range(60)], rounds=6)
    config = load_job_config(path)
    system = open_changelog_system(config)
    stream = "shared-counts-counts-changelog"
    lost = {info.key: info.size for info in system.objects(stream, 0)}
    for info in system.store.list("jobs/shared-counts/checkpoints/0"):
        system.store.delete(info.key)
    stats = system.collect_garbage(stream, now=time.time() + 10 ** 6)
    assert {info.key: info.size for info in system.objects(stream, 0)} == lost  # kept whole
    named = system.manifest_objects(checkpoint_store(config).load(1).manifests["counts"])
    kept = [system.store.where(info.key) for info in system.objects(stream, 1)]
    assert sorted(kept) == sorted(where for where, _size in named)  # partition 1: only its committed chain
    assert stats.segments_deleted > 0
    system.close()
