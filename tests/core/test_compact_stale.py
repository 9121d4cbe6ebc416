"""Stale local state: a store whose local offset is below the changelog's compaction horizon (the
offset after the last tombstone compaction dropped) is rebuilt from scratch when its task opens, so a
deleted key stays deleted; newer local state is not rebuilt; recover_store refuses a stale store."""

from __future__ import annotations

import shutil
import textwrap
import time
from pathlib import Path

import pytest

from localstate.core.config import JobConfig, load_job_config
from localstate.runtime.partition.recovery import compaction_horizon, recover_store
from localstate.runtime.layout import checkpoint_store, open_changelog_system, store_directory
from localstate.runtime.partition.instance import TaskInstance
from localstate.core.task import Envelope, StreamTask
from localstate.errors import RestoreError

STREAM = "stale-counts-changelog"
LATER = time.time() + 3 * 86400  # "now" for compaction: every tombstone is past the 1-day retention


class Tally(StreamTask):
    """Counts per key; the value ``"del"`` deletes the key."""

    def init(self, context):  # noqa: ANN001
        self.counts = context.store("counts")

    def process(self, envelope, collector, coordinator):  # noqa: ANN001
        if envelope.value == "del":
            self.counts.delete(envelope.key)
        else:
            self.counts.put(envelope.key, (self.counts.get(envelope.key) or 0) + 1)


def make_job(tmp_path: Path, backend: str) -> JobConfig:
    job_file = tmp_path / "job.toml"
    job_file.write_text(textwrap.dedent(f"""
        [job]
        name = "stale"
        task = "x:y"
        [changelogs.file]
        fsync = false
        segment_bytes = "1kB"
        [stores.counts]
        engine = "kv"
        backend = "{backend}"
        key_serde = "string"
        value_serde = "int"
    """))
    return load_job_config(job_file)


class Job:
    """Drives partition 0 of the job through TaskInstance, one committed session at a time."""

    def __init__(self, job: JobConfig) -> None:
        self.job = job
        self.offset = 0

    def session(self, items: list[tuple[str, object]]) -> TaskInstance:
        instance = TaskInstance(self.job, 0, open_changelog_system(self.job), task_factory=Tally)
        instance.open()
        for key, value in items:
            instance.process(Envelope("in", 0, self.offset, key, value))
            self.offset += 1
            if self.offset % 50 == 0:
                instance.commit()
        instance.close(commit=True)
        return instance

    def state(self) -> tuple[dict, list]:
        instance = TaskInstance(self.job, 0, open_changelog_system(self.job), task_factory=Tally)
        recoveries = instance.open()
        try:
            return dict(instance.stores["counts"].engine.all()), recoveries
        finally:
            instance.close(commit=False)

    def compact(self) -> None:
        upto = checkpoint_store(self.job).load(0).changelogs["counts"]
        system = open_changelog_system(self.job)
        system.compact(STREAM, 0, upto, now=LATER)
        system.close()

    def save_local(self, to: Path) -> None:
        shutil.copytree(store_directory(self.job, "counts", 0), to)

    def put_back_local(self, saved: Path) -> None:
        target = store_directory(self.job, "counts", 0)
        shutil.rmtree(target)
        shutil.copytree(saved, target)


def busy(n: int, keys: int = 8) -> list[tuple[str, object]]:
    return [(f"k{i % keys}", i) for i in range(n)]


@pytest.mark.parametrize("backend", ["rocksdb", "lmdb"])
def test_stale_store_is_rebuilt_and_the_deleted_key_stays_deleted(tmp_path, backend):
    job = Job(make_job(tmp_path, backend))
    job.session([("gone", 1), ("gone", 2)] + busy(100))
    job.save_local(tmp_path / "old")                 # a host that then stayed offline
    job.session([("gone", "del")] + busy(300))       # the key is deleted, history goes on
    expected, _ = job.state()
    assert "gone" not in expected
    job.compact()                                    # the expired tombstone is dropped
    reader = open_changelog_system(job.job).reader(STREAM, 0)
    assert not any(r.key == b"gone" for r in reader.read())
    assert compaction_horizon(reader) > 0

    job.put_back_local(tmp_path / "old")
    state, recoveries = job.state()
    assert recoveries[0].status == "rebuilt" and recoveries[0].local_offset is None
    assert "gone" not in state
    assert state == expected


def test_store_at_or_above_the_horizon_is_not_rebuilt(tmp_path):
    job = Job(make_job(tmp_path, "rocksdb"))
    job.session([("gone", 1)] + busy(60))
    job.session([("gone", "del")] + busy(60))
    job.save_local(tmp_path / "after-delete")        # local state that has applied the delete
    job.session(busy(200))
    expected, _ = job.state()
    job.compact()
    job.put_back_local(tmp_path / "after-delete")
    state, recoveries = job.state()
    assert recoveries[0].status == "replayed" and recoveries[0].local_offset is not None
    assert state == expected and "gone" not in state


def test_horizon_only_grows_and_a_later_stale_store_is_still_caught(tmp_path):
    job = Job(make_job(tmp_path, "rocksdb"))
    job.session([("a", 1), ("b", 1)] + busy(50))
    job.save_local(tmp_path / "oldest")
    job.session([("a", "del")] + busy(50))
    job.compact()
    reader = open_changelog_system(job.job).reader(STREAM, 0)
    first = compaction_horizon(reader)
    job.session(busy(50))
    job.save_local(tmp_path / "middle")               # above the first horizon ...
    job.session([("b", "del")] + busy(100))
    job.compact()
    second = compaction_horizon(reader)
    assert second > first
    expected, _ = job.state()
    assert "a" not in expected and "b" not in expected
    for saved in ("oldest", "middle"):               # ... but below the second: rebuilt too
        job.put_back_local(tmp_path / saved)
        state, recoveries = job.state()
        assert recoveries[0].status == "rebuilt"
        assert state == expected
    job.compact()  # nothing new to drop: the horizon stays
    assert compaction_horizon(reader) == second


def test_recover_store_refuses_a_stale_engine(tmp_path):
    job = Job(make_job(tmp_path, "rocksdb"))
    job.session([("gone", 1)] + busy(40))
    job.save_local(tmp_path / "old")
    job.session([("gone", "del")] + busy(200))
    job.compact()
    job.put_back_local(tmp_path / "old")
    registry = job.job.registry
    config = job.job.stores["counts"]
    system = open_changelog_system(job.job)
    changelog = system.partition(STREAM, 0)
    from localstate.core.engine import StoreContext

    context = StoreContext(job="stale", store="counts", partition=0,
                           directory=store_directory(job.job, "counts", 0), options=config.options,
                           key_serde=registry.serde(config.key_serde), value_serde=registry.serde(config.value_serde),
                           changelog=changelog, logged=True)
    engine = registry.engine_factory("kv").create(context)
    try:
        with pytest.raises(RestoreError) as info:
            recover_store(engine, changelog, checkpoint_store(job.job).load(0).changelogs["counts"], label="c")
        assert info.value.context["store"] == "counts" and "horizon" in str(info.value) and info.value.hint
    finally:
        engine.close()
        changelog.close()
        system.close()
