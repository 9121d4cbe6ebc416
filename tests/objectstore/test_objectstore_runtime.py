"""Jobs on the ``objectstore`` changelog through the real runtime (TaskInstance, kv on RocksDB):
exact state, crashes between flush and checkpoint, zombie writers on another "host" (another
state directory: its own local stores and instance locks, the same shared storage), moves to a
host without local state, and damaged storage. On a shared directory and on SeaweedFS S3."""

from __future__ import annotations

import shutil
from collections import Counter as Tally
from pathlib import Path
from typing import Any

import pytest

from localstate.core.config import parse_job_config
from localstate.runtime.layout import checkpoint_store, open_changelog_system, store_directory
from localstate.runtime.partition.instance import MemorySink, TaskInstance
from localstate.core.stream import InputRecord
from localstate.core.task import StreamTask
from localstate.errors import ChangelogError, FencedError

COUNTS = {"counts": {"engine": "kv", "backend": "rocksdb", "key_serde": "string", "value_serde": "int"}}


class Counter(StreamTask):
    def init(self, context):
        self.counts = context.store("counts")

    def process(self, envelope, collector, coordinator):
        if envelope.value == "delete":
            self.counts.delete(envelope.key)
            return
        self.counts.put(envelope.key, (self.counts.get(envelope.key) or 0) + 1)


def job_on(host: Path, options: dict[str, Any], *, pipelined_commits: bool = False, **changelog: Any):
    """The job as the host with local directory ``host`` sees it: local stores there, changelogs and
    checkpoints in the shared storage of ``options``. Commits are synchronous unless
    ``pipelined_commits`` (these tests check the synchronous protocol, which the Spark path uses;
    test_objectstore_pipelined.py checks the pipelined one)."""
    return parse_job_config({"job": {"name": "counting", "partitions": 1, "task": "unused:Unused",
                                     "changelog": "objectstore", "commit_interval": 10 ** 9,
                                     "pipelined_commits": pipelined_commits, "state_dir": str(host)},
                             "stores": COUNTS, "changelogs": {"objectstore": {**options, **changelog}}},
                            base_dir=host)


class Host:
    """One task instance of partition 0 on one host."""

    def __init__(self, root: Path, options: dict[str, Any], *, pipelined_commits: bool = False,
                 **changelog: Any) -> None:
        self.job = job_on(root, options, pipelined_commits=pipelined_commits, **changelog)
        self.system = open_changelog_system(self.job)
        self.instance = TaskInstance(self.job, 0, self.system, MemorySink(), Counter)
        self.recoveries = self.instance.open()

    def feed(self, records: list[tuple[str, Any]]) -> None:
        start = self.instance.position("in")
        self.instance.feed(("in", InputRecord(start + i, key, value, 0.0)) for i, (key, value) in enumerate(records))

    def state(self) -> dict[str, int]:
        return dict(self.instance.stores["counts"].engine.all())

    def changelog(self):
        return self.instance.stores["counts"].changelog


def inputs(n: int, seed: int = 0) -> list[tuple[str, Any]]:
    return [(f"k{(i * 7 + seed) % 37}", "delete" if (i + seed) % 11 == 0 else i) for i in range(n)]


def expected(records: list[tuple[str, Any]]) -> dict[str, int]:
    state: Tally[str] = Tally()
    for key, value in records:
        if value == "delete":
            state.pop(key, None)
        else:
            state[key] += 1
    return dict(state)


def test_job_state_is_exact_and_moves_to_a_host_without_local_state(objectstore_options, tmp_path):
    host_a = Host(tmp_path / "a", objectstore_options, snapshot_every=3)
    fed: list[tuple[str, Any]] = []
    for batch in range(8):
        records = inputs(120, seed=batch)
        host_a.feed(records)
        fed += records
        host_a.instance.commit()
        host_a.changelog().wait_for_snapshot()
    assert host_a.state() == expected(fed)
    manifest = checkpoint_store(host_a.job).load(0).manifests["counts"]
    assert manifest["snapshot"] is not None and len(manifest["deltas"]) < 8
    host_a.instance.close(commit=False)
    # Host B has no local state: snapshot + tail from the shared storage, then it goes on.
    host_b = Host(tmp_path / "b", objectstore_options, snapshot_every=3)
    (recovery,) = host_b.recoveries
    assert recovery.local_offset is None and recovery.status == "rebuilt"
    assert recovery.replayed < len(fed)  # the snapshot holds the live keys, not the history
    assert host_b.state() == expected(fed)
    more = inputs(50, seed=99)
    host_b.feed(more)
    host_b.instance.commit()
    host_b.instance.close(commit=False)
    # Back on host A: its local state is older than the committed position; it catches up.
    host_a = Host(tmp_path / "a", objectstore_options)
    assert host_a.state() == expected(fed + more)
    host_a.instance.close(commit=False)


def test_crash_after_flush_before_checkpoint_leaves_an_invisible_orphan(objectstore_options, tmp_path):
    host = Host(tmp_path / "a", objectstore_options)
    committed = inputs(100)
    host.feed(committed)
    host.instance.commit()
    host.feed(inputs(60, seed=5))
    host.instance.prepare_commit()  # the changelog delta is written...
    objects = host.system.objects("counting-counts-changelog", 0)
    host.instance.abandon()  # ...and the process dies before the checkpoint
    shutil.rmtree(store_directory(host.job, "counts", 0))  # and its local state with the host
    again = Host(tmp_path / "a", objectstore_options)
    assert again.recoveries[0].trimmed == 0  # nothing to neutralise: the orphan is simply not named
    assert again.state() == expected(committed)
    named = {f"changelogs/counting-counts-changelog/0/{d['object']}" for d in again.changelog().manifest()["deltas"]}
    orphans = {info.key for info in objects} - named
    assert len(named) == 1 and len(orphans) == 1  # the commit's delta is named, the crashed flush's is not
    again.instance.close(commit=False)


def test_zombie_writer_cannot_make_its_records_visible(objectstore_options, tmp_path):
    old = Host(tmp_path / "host-a", objectstore_options)
    first = inputs(80)
    old.feed(first)
    old.instance.commit()
    # Host A stalls (a long GC pause, a partition); the partition moves to host B.
    new = Host(tmp_path / "host-b", objectstore_options)
    assert new.state() == expected(first)
    second = inputs(40, seed=3)
    new.feed(second)
    new.instance.commit()
    # Host A wakes up and goes on writing: its deltas reach the shared storage...
    old.feed([("k1", 1)] * 500)
    old.instance.prepare_commit()
    # ...but its checkpoint is fenced, so no committed manifest ever names them.
    with pytest.raises(FencedError):
        old.instance.commit()
    old.instance.abandon()
    stream = "counting-counts-changelog"
    writers = {info.key.rsplit("-", 1)[1] for info in new.system.objects(stream, 0)}
    assert len(writers) == 2  # host A's zombie deltas are there, next to host B's
    new.instance.close(commit=False)
    reader = Host(tmp_path / "host-c", objectstore_options)
    assert reader.state() == expected(first + second)
    reader.instance.close(commit=False)


def test_missing_committed_object_is_a_typed_error_naming_it(objectstore_options, tmp_path):
    host = Host(tmp_path / "a", objectstore_options)
    host.feed(inputs(50))
    host.instance.commit()
    manifest = host.changelog().manifest()
    host.instance.close(commit=False)
    victim = manifest["deltas"][-1]["object"]
    host.system.store.delete(f"changelogs/counting-counts-changelog/0/{victim}")
    with pytest.raises(ChangelogError, match="missing") as caught:
        Host(tmp_path / "b", objectstore_options)  # no local state: it must read the object
    assert victim in str(caught.value)
    assert caught.value.context["stream"] == "counting-counts-changelog" and caught.value.context["partition"] == 0


def test_checkpoints_live_in_the_shared_storage(objectstore_options, tmp_path):
    host = Host(tmp_path / "a", objectstore_options)
    host.feed(inputs(10))
    host.instance.commit()
    host.instance.close(commit=False)
    store = checkpoint_store(host.job)
    assert store.objects is not None and store.describe()["path"].endswith("jobs/counting/checkpoints")
    assert not any((tmp_path / "a" / "counting" / "checkpoints").glob("*.json"))
    # A driver on another host (another state dir) sees the same committed positions.
    assert checkpoint_store(job_on(tmp_path / "b", objectstore_options)).load(0).inputs == {"in": 10}
