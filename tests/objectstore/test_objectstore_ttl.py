"""A kv store with ttl on the objectstore changelog: after a snapshot (last record per key, written
by the compactor) and a restore on a host without local state, no expired entry comes back
(docs/time/ttl.md). On a shared directory and on S3 (SeaweedFS)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from localstate.changelog.objectstore import ObjectStoreChangelogSystem
from localstate.runtime.partition.recovery import recover_store
from localstate.testing.time import ManualTime

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from kv.ttl_support import NEW, OLD, open_ttl_store, visible_keys, write_history  # noqa: E402


def test_no_comeback_after_an_objectstore_snapshot(objectstore_options: dict[str, Any], tmp_path: Path) -> None:
    time = ManualTime(processing_time=1_000.0)
    system = ObjectStoreChangelogSystem({**objectstore_options, "snapshot_every": 3}, tmp_path / "host1")
    system.ensure_stream("sessions", 1)
    log = system.partition("sessions", 0)
    kv = open_ttl_store(tmp_path / "host1" / "store", log, time)
    write_history(kv, time)
    log.wait_for_snapshot()
    manifest = log.manifest()
    end = log.end_offset()
    assert manifest["snapshot"] is not None  # the old* records are in the snapshot object
    kv.close()
    log.close()
    system.close()

    time.advance_processing_time(5)  # 1011: old* expired, new* live
    other = ObjectStoreChangelogSystem({**objectstore_options, "snapshot_every": 3}, tmp_path / "host2")
    log = other.partition("sessions", 0)
    log.adopt(manifest)
    fresh = open_ttl_store(tmp_path / "host2" / "store", log, time)
    recover_store(fresh, log, end, label="ttl snapshot test")
    assert visible_keys(fresh, OLD + NEW) == set(NEW)
    time.advance_processing_time(10)
    fresh.flush()
    assert visible_keys(fresh, OLD + NEW) == set()
    fresh.close()
    log.close()
    other.close()
