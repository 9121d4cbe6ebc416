"""Write-behind (``write_behind = true``): reads see a commit whose backend write is still running,
a failed background write is raised typed by the next flush (and the store refuses to go on), and
close() waits for the write so a reopen needs no replay."""

from __future__ import annotations

import errno
import threading
from pathlib import Path

import pytest

from localstate.changelog.memory import MemoryChangelogPartition
from localstate.core.engine import StoreContext
from localstate.core.serdes import IntSerde, StringSerde
from localstate.engines.kv import KeyValueEngineFactory
from localstate.errors import StoreIOError


def open_kv(directory: Path, changelog: MemoryChangelogPartition, backend: str, **options):
    factory = KeyValueEngineFactory()
    validated = factory.validate_options("wb", {"backend": backend, "write_behind": True, **options})
    return factory.create(StoreContext("job", "wb", 0, directory, validated, StringSerde(), IntSerde(), changelog))


def hold_backend_writes(kv) -> tuple[threading.Event, threading.Event]:
    """Make the backend's writes wait for ``release``; ``started`` is set when one begins."""
    started, release = threading.Event(), threading.Event()
    real = kv.backend._write

    def held(*args, **kwargs):
        started.set()
        release.wait()
        return real(*args, **kwargs)

    kv.backend._write = held
    return started, release


def test_reads_see_a_commit_whose_backend_write_is_running(tmp_path: Path) -> None:
    changelog = MemoryChangelogPartition("wb", 0)
    kv = open_kv(tmp_path, changelog, "rocksdb", cache_size=0)  # no object cache: every get misses
    kv.put_all({"old": 1, "gone": 1})
    kv.flush()
    started, release = hold_backend_writes(kv)
    try:
        kv.put("new", 2)
        kv.put("old", 3)
        kv.delete("gone")
        kv.flush()
        assert started.wait(30)
        assert kv._logged.writing and kv.backend.get(b"new") is None  # the write has not landed
        assert (kv.get("new"), kv.get("old"), kv.get("gone")) == (2, 3, None)  # served from the in-flight map
        assert kv.get("absent") is None  # read from RocksDB while the write runs (concurrent reads)
    finally:
        release.set()
    assert dict(kv.all()) == {"new": 2, "old": 3}  # iteration settles first
    assert kv.local_offset() == changelog.end_offset()
    kv.close()


@pytest.mark.parametrize("backend", ["rocksdb", "lmdb", "memory"])
def test_state_and_offset_across_flushes_and_reopen(tmp_path: Path, backend: str) -> None:
    changelog = MemoryChangelogPartition("wb", 0)
    kv = open_kv(tmp_path, changelog, backend, cache_size=3, write_batch_size=7)  # evictions and spills
    model: dict[str, int] = {}
    for step in range(400):
        key = f"k{(step * 37) % 23:02d}"
        if step % 11 == 0:
            kv.delete(key)
            model.pop(key, None)
        else:
            value = (kv.get(key) or 0) + step
            kv.put(key, value)
            model[key] = value
        assert kv.get(key) == model.get(key)
        if step % 5 == 4:
            kv.flush()
    kv.flush()
    assert dict(kv.all()) == model
    kv.close()
    if backend != "memory":
        kv = open_kv(tmp_path, changelog, backend)
        assert kv.local_offset() == changelog.end_offset()  # close() waited for the last write
        assert dict(kv.all()) == model
        kv.close()


@pytest.mark.parametrize("backend", ["rocksdb", "lmdb"])
def test_failed_background_write_is_raised_typed_and_sticks(tmp_path: Path, backend: str) -> None:
    changelog = MemoryChangelogPartition("wb", 0)
    kv = open_kv(tmp_path, changelog, backend)
    kv.put("a", 1)
    kv.flush()
    committed = kv.local_offset()

    def disk_full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    kv.backend._write = disk_full
    kv.put("a", 2)
    kv.flush()  # durable in the changelog; the backend write fails in the background
    with pytest.raises(StoreIOError) as first:
        kv.put("b", 3)
        kv.flush()
    assert first.value.errno == errno.ENOSPC and first.value.context.get("store") == "wb"
    with pytest.raises(StoreIOError):
        dict(kv.all())  # every later local access refuses: the backend missed a commit
    kv.close()  # logs, does not raise: the changelog holds the commit
    kv = open_kv(tmp_path, changelog, backend)
    assert kv.local_offset() == committed  # the failed write left the backend at the previous commit
    kv.close()
