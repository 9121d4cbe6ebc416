"""Local state is a cache of the changelog: when its files are damaged (a byte flipped in a RocksDB
.sst, a damaged LMDB data.mdb) the store is discarded and rebuilt from the intact changelog, with
the exact committed state; damage found in the middle of processing is a StoreCorruptError (never a
TaskError), and the next open rebuilds. Also: local state ahead of its changelog is rebuilt, and a
changelog holding keys LMDB cannot store is a typed RestoreError."""

from __future__ import annotations

import glob
import os
from pathlib import Path

import pytest

from localstate.core.corruption import CORRUPT_MARKER
from localstate.runtime.layout import checkpoint_store, store_directory
from localstate.changelog.file.streams import truncate_log
from localstate.core.task import StreamTask
from localstate.testing.driver import TaskTestDriver
from localstate.errors import RestoreError, StoreCorruptError, TaskError


class Counter(StreamTask):
    def init(self, context):  # noqa: ANN001
        self.counts = context.store("counts")

    def process(self, envelope, collector, coordinator):  # noqa: ANN001
        self.counts.put(envelope.key, (self.counts.get(envelope.key) or 0) + envelope.value)


def _stores(backend: str) -> dict:
    return {"counts": {"engine": "kv", "backend": backend, "key_serde": "string", "value_serde": "int",
                       "cache_size": 0, "compression": "none"} if backend == "rocksdb" else
            {"engine": "kv", "backend": backend, "key_serde": "string", "value_serde": "int", "cache_size": 0}}


def _fill(driver: TaskTestDriver, keys: int = 3000) -> dict[str, int]:
    expected: dict[str, int] = {}
    for i in range(keys * 2):
        key = f"key-{i % keys:06d}"
        driver.send("in", key, i)
        expected[key] = expected.get(key, 0) + i
    driver.commit()
    return expected


def _damage(path: str, at: float, length: int = 64) -> None:
    data = bytearray(Path(path).read_bytes())
    start = int(len(data) * at)
    for i in range(start, min(start + length, len(data))):
        data[i] ^= 0xA5
    Path(path).write_bytes(bytes(data))


def _state(driver: TaskTestDriver) -> dict[str, int]:
    return dict(driver.store("counts").all())


def test_rocksdb_flipped_sst_bytes_never_read_as_a_shorter_store_and_rebuilt(tmp_path: Path) -> None:
    with TaskTestDriver(Counter, stores=_stores("rocksdb"), state_dir=tmp_path) as driver:
        expected = _fill(driver)
        driver.store("counts").backend._db.flush()  # data into an .sst file (not only the WAL)
        driver.crash()
        directory = store_directory(driver.job, "counts", 0)
        ssts = glob.glob(str(directory / "rocksdb" / "*.sst"))
        assert ssts
        _damage(max(ssts, key=os.path.getsize), 0.5)
        driver.restart()
        # The damage is found by the scan (iterator status) instead of ending it early ...
        with pytest.raises(StoreCorruptError) as info:
            _state(driver)
        assert info.value.context["store"] == "counts" and "what to do" in str(info.value)
        assert (directory / "rocksdb" / CORRUPT_MARKER).exists()
        # ... and the next open (the retried attempt) rebuilds from the changelog.
        recoveries = driver.restart()
        assert recoveries[0].local_offset is None and recoveries[0].replayed > 0
        assert _state(driver) == expected
        assert not (directory / "rocksdb" / CORRUPT_MARKER).exists()


def test_rocksdb_damage_found_by_a_point_read_is_not_a_task_error(tmp_path: Path) -> None:
    with TaskTestDriver(Counter, stores=_stores("rocksdb"), state_dir=tmp_path) as driver:
        expected = _fill(driver)
        driver.store("counts").backend._db.flush()
        driver.crash()
        directory = store_directory(driver.job, "counts", 0)
        for sst in glob.glob(str(directory / "rocksdb" / "*.sst")):
            for at in (0.1, 0.3, 0.5, 0.7):
                _damage(sst, at, 16)
        driver.restart()
        with pytest.raises(StoreCorruptError) as info:
            for i in range(3000):  # reads every data block: one of them is damaged
                driver.send("in", f"key-{i:06d}", 0)
        assert not isinstance(info.value, TaskError)
        driver.restart()
        assert _state(driver) == expected


@pytest.mark.parametrize("at", [0.0, 0.3, 0.6, 0.9])
def test_lmdb_damaged_data_mdb_is_rebuilt_from_the_changelog(tmp_path: Path, at: float) -> None:
    with TaskTestDriver(Counter, stores=_stores("lmdb"), state_dir=tmp_path) as driver:
        expected = _fill(driver)
        driver.crash()
        data = store_directory(driver.job, "counts", 0) / "lmdb" / "data.mdb"
        _damage(str(data), at, 4096)
        driver.restart()
        try:
            state = _state(driver)
        except StoreCorruptError:
            driver.restart()  # found while reading: the next open rebuilds
            state = _state(driver)
        # LMDB keeps no checksums: damage to a value's bytes cannot be seen; damage to the B-tree can,
        # and then the store is rebuilt. Either way every key is there.
        assert set(state) == set(expected)
        if state != expected:
            driver.crash()
            (store_directory(driver.job, "counts", 0) / "lmdb" / CORRUPT_MARKER).write_text("test")
            driver.restart()
            assert _state(driver) == expected


def test_lmdb_unreadable_file_at_open_is_rebuilt(tmp_path: Path) -> None:
    with TaskTestDriver(Counter, stores=_stores("lmdb"), state_dir=tmp_path) as driver:
        expected = _fill(driver, 500)
        driver.crash()
        data = store_directory(driver.job, "counts", 0) / "lmdb" / "data.mdb"
        _damage(str(data), 0.0, 8192)  # both meta pages: "not an LMDB file"
        recoveries = driver.restart()
        assert recoveries[0].local_offset is None
        assert _state(driver) == expected


@pytest.mark.parametrize("backend", ["rocksdb", "lmdb"])
def test_local_state_ahead_of_changelog_is_rebuilt(tmp_path: Path, backend: str) -> None:
    """A lost changelog tail (fsync = false and a machine crash): local state holds updates the
    changelog does not, which must not stay visible (they would be applied twice on re-delivery)."""
    with TaskTestDriver(Counter, stores=_stores(backend), state_dir=tmp_path) as driver:
        expected = _fill(driver, 50)
        driver.send("in", "key-000001", 1000)
        driver.send("in", "extra", 5)
        driver.instances[0].prepare_commit()  # local state and changelog hold the two updates ...
        driver.crash()
        committed = checkpoint_store(driver.job).load(0).changelogs["counts"]
        partition_dir = tmp_path / "changelogs" / "test-job-counts-changelog" / "0"
        truncate_log(partition_dir, committed)  # ... then the changelog loses its unsynced tail
        driver.inputs[("in", 0)] = driver.inputs[("in", 0)][:-2]  # the input is re-delivered: nothing
        recoveries = driver.restart()
        assert recoveries[0].local_offset is None  # discarded, rebuilt from 0
        assert _state(driver) == expected
        driver.send("in", "key-000001", 1000)
        expected["key-000001"] += 1000
        driver.commit()
        assert _state(driver) == expected


def test_switch_to_lmdb_with_keys_it_cannot_hold_is_a_restore_error(tmp_path: Path) -> None:
    long_key = "x" * 600
    with TaskTestDriver(Counter, stores=_stores("rocksdb"), state_dir=tmp_path) as driver:
        driver.send("in", long_key, 1)
        driver.send("in", "short", 2)
        driver.commit()
    with pytest.raises(RestoreError) as info:
        with TaskTestDriver(Counter, stores=_stores("lmdb"), state_dir=tmp_path):
            pass
    assert info.value.context["key_size"] == 600
    assert info.value.context["store"] == "counts"
    assert "rocksdb" in info.value.hint


def test_lmdb_restore_skips_tombstones_of_keys_it_cannot_hold(tmp_path: Path) -> None:
    class Deleter(Counter):
        def process(self, envelope, collector, coordinator):  # noqa: ANN001
            if envelope.value < 0:
                self.counts.delete(envelope.key)
            else:
                super().process(envelope, collector, coordinator)

    with TaskTestDriver(Deleter, stores=_stores("rocksdb"), state_dir=tmp_path) as driver:
        driver.send("in", "y" * 600, -1)  # a tombstone of a long key
        driver.send("in", "short", 2)
        driver.commit()
    with TaskTestDriver(Deleter, stores=_stores("lmdb"), state_dir=tmp_path) as driver:
        assert _state(driver) == {"short": 2}


def test_corrupt_marker_never_follows_a_symlink(tmp_path: Path) -> None:
    from localstate.core.corruption import corrupt_reason, mark_corrupt

    outside = tmp_path / "outside.txt"
    outside.write_text("keep")
    store = tmp_path / "store"
    store.mkdir()
    (store / CORRUPT_MARKER).symlink_to(outside)
    mark_corrupt(store, "damage")
    assert outside.read_text() == "keep"
    assert corrupt_reason(store) is None  # a marker localstate did not write does not count
    (store / CORRUPT_MARKER).unlink()
    mark_corrupt(store, "damage")
    assert corrupt_reason(store) == "damage"
