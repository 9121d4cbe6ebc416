"""No expired entry comes back: after a restore from a file changelog, from a compacted one, and
after reopening local state; the expiry travels with each logged record (docs/time/ttl.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from localstate.changelog.file import FileChangelogSystem
from localstate.runtime.partition.recovery import recover_store
from localstate.testing.time import ManualTime

from .ttl_support import NEW, OLD, open_ttl_store, visible_keys, write_history


@pytest.mark.parametrize("backend", ["rocksdb", "lmdb", "memory"])
@pytest.mark.parametrize("compact", [False, True], ids=["full", "compacted"])
def test_no_comeback_after_restore_from_a_file_changelog(tmp_path: Path, backend: str, compact: bool) -> None:
    system = FileChangelogSystem({}, tmp_path / "changelogs")
    system.ensure_stream("sessions", 1)
    time = ManualTime(processing_time=1_000.0)
    log = system.partition("sessions", 0)
    kv = open_ttl_store(tmp_path / "host1", log, time, backend=backend)
    write_history(kv, time)
    end = log.end_offset()
    kv.close()
    log.close()
    if compact:
        stats = system.compact("sessions", 0, end)
        assert stats.records_after < stats.records_before
    time.advance_processing_time(5)  # 1011: old* expired, new* live; nothing was swept

    # another host, no local state: everything from the (compacted) changelog
    log = system.partition("sessions", 0)
    fresh = open_ttl_store(tmp_path / "host2", log, time, backend=backend)
    recover_store(fresh, log, end, label="ttl test")
    assert visible_keys(fresh, OLD + NEW) == set(NEW)
    assert all(fresh.backend.get(key.encode()) is None for key in OLD)  # expired records are not restored
    time.advance_processing_time(10)
    fresh.flush()
    assert visible_keys(fresh, OLD + NEW) == set()
    fresh.close()
    log.close()
    system.close()


@pytest.mark.parametrize("backend", ["rocksdb", "lmdb"])
def test_no_comeback_from_local_state_and_the_sweep_logs_tombstones(tmp_path: Path, backend: str) -> None:
    system = FileChangelogSystem({}, tmp_path / "changelogs")
    system.ensure_stream("sessions", 1)
    time = ManualTime(processing_time=1_000.0)
    log = system.partition("sessions", 0)
    kv = open_ttl_store(tmp_path / "host", log, time, backend=backend, ttl_sweep=4)
    write_history(kv, time)
    end = log.end_offset()
    kv.close()
    time.advance_processing_time(5)
    again = open_ttl_store(tmp_path / "host", log, time, backend=backend, ttl_sweep=4)
    recover_store(again, log, end, label="ttl test")
    assert again.local_offset() == end  # local state reused, not rebuilt
    assert visible_keys(again, OLD + NEW) == set(NEW)
    for _ in range(3):
        again.flush()  # three bounded sweeps pass over the 10 entries
    tombstones = {record.key.decode() for record in log.read(end) if record.value is None}
    assert tombstones == set(OLD)
    assert again.swept == len(OLD)
    again.close()
    log.close()
    system.close()
