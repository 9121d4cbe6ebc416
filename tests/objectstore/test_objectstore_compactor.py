"""The compactor subprocess of the ``objectstore`` changelog (docs/durable.md, "Snapshots"):

* a snapshot the subprocess builds equals the in-process one, byte for byte, and the plain model
  of "last record per key", on random histories with overwrites and deletes;
* snapshot + tail equals a full replay, also when the chain was adopted from another writer (the
  child reads the objects it was not fed from storage);
* the child SIGKILLed with a snapshot request in flight loses nothing: the snapshot is simply not
  named, later snapshots are built in-process, and a new writer restores exactly;
* a writer SIGKILLed leaves no compactor behind (EOF on its stdin; a parent-pid check when a forked
  process keeps the pipe open);
* no manifest ever names an object that is not written.

Each case runs on a shared directory and on SeaweedFS S3."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any, Callable

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from localstate.changelog.file.partition import decode_records
from localstate.changelog.objectstore import ObjectStoreChangelogSystem
from localstate.changelog.objectstore.chain import OBJECT_HEADER
from localstate.errors import ConfigError

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from test_objectstore_changelog import chain_state  # noqa: E402

Op = tuple[int, int | None]  # (key number, value number or None: delete)
flush_ops = st.lists(st.tuples(st.integers(0, 20), st.one_of(st.none(), st.integers(0, 1000))), max_size=60)


def record(op: Op) -> tuple[bytes, bytes | None]:
    key, value = op
    return b"k%d" % key, None if value is None else b"v%d" % value


def model(ops: list[Op]) -> dict[bytes, bytes]:
    state: dict[bytes, bytes] = {}
    for key, value in map(record, ops):
        if value is None:
            state.pop(key, None)
        else:
            state[key] = value
    return state


@pytest.fixture(params=["shared-dir", "s3"])
def location(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Callable[[], dict[str, Any]]:
    """A factory of fresh ``[changelogs.objectstore]`` locations (one per hypothesis example)."""
    if request.param == "shared-dir":
        root = tmp_path_factory.mktemp("shared")
        return lambda: {"url": str(root / uuid.uuid4().hex[:12])}
    server = request.getfixturevalue("seaweed")
    return lambda: server.options(f"t-{uuid.uuid4().hex[:12]}")


def open_log(options: dict[str, Any], state_dir: Path, **extra: Any):
    system = ObjectStoreChangelogSystem({**options, **extra}, state_dir)
    system.ensure_stream("s", 1)
    return system, system.partition("s", 0)


def snapshot_records(system: ObjectStoreChangelogSystem, manifest: dict[str, Any]) -> list[tuple[int, bytes, bytes]]:
    """(offset, key, value) of the snapshot's records, verified (the writers' timestamps differ)."""
    data = system.store.get(f"changelogs/s/0/{manifest['snapshot']['object']}")
    records, position, _next = decode_records(data, OBJECT_HEADER.size, len(data), 0, 1 << 62)
    assert position == len(data)
    return [(r.offset, r.key, r.value) for r in records]


def gone(pid: int) -> bool:
    """True once ``pid`` has exited (a zombie nobody reaped yet counts as exited)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return True
    return "\nState:\tZ" in status


def wait_until_gone(pid: int, limit: float = 60.0) -> bool:
    deadline = time.monotonic() + limit  # a bound on waiting, not a speed assertion
    while time.monotonic() < deadline:
        if gone(pid):
            return True
        time.sleep(0.1)
    return gone(pid)


# ---------------------------------------------------------------- equal to the in-process snapshots

@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(flush_ops, min_size=1, max_size=10), st.integers(1, 3))
def test_the_subprocess_snapshot_equals_the_in_process_one(location, tmp_path_factory, flushes, every):
    state_dir = tmp_path_factory.mktemp("state")
    logs = {mode: open_log(location(), state_dir, snapshot_every=every, compactor=mode)
            for mode in ("process", "thread")}
    for _system, log in logs.values():
        log.adopt(None)
    ops: list[Op] = []
    manifests: dict[str, dict[str, Any]] = {}
    for batch in flushes:
        ops += batch
        for mode, (_system, log) in logs.items():
            log.append_many(map(record, batch))
            log.flush()
            log.wait_for_snapshot()  # both modes snapshot at the same flushes
            manifests[mode] = log.manifest()
        process, thread = manifests["process"], manifests["thread"]
        assert (process["snapshot"] is None) == (thread["snapshot"] is None)
        if process["snapshot"] is not None:
            assert {k: process["snapshot"][k] for k in ("start", "end", "records", "bytes")} == \
                   {k: thread["snapshot"][k] for k in ("start", "end", "records", "bytes")}
            assert snapshot_records(logs["process"][0], process) == snapshot_records(logs["thread"][0], thread)
    process_system, process_log = logs["process"]
    if process_log.snapshots_written:
        assert process_log.compactor_snapshots == process_log.snapshots_written  # not the in-process fallback
        assert process_log.compactor_pid is not None
    for system, log in logs.values():
        log.close()
        reader = system.reader("s", 0)
        reader.adopt(manifests["process" if system is process_system else "thread"])
        assert chain_state(reader) == model(ops)
        system.close()
    if process_log.snapshots_written:
        assert process_log.compactor_pid is None and process_log.compactor_cpu_seconds > 0  # reaped at close()

