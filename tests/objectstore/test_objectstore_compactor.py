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
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from localstate.changelog.framing import decode_records
from localstate.changelog.objectstore import ObjectStoreChangelogSystem
from localstate.changelog.objectstore.chain import OBJECT_HEADER
from localstate.errors import ConfigError

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from test_objectstore_changelog import chain_state  # noqa: E402
from test_objectstore_durability import location  # noqa: E402,F401 - the fixture: fresh locations per example

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



# ---------------------------------------------------------------- snapshot + tail, adopted chains

@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(flush_ops, min_size=1, max_size=8), st.lists(flush_ops, min_size=1, max_size=8), st.integers(1, 3))
def test_snapshot_plus_tail_equals_a_full_replay_across_a_move(location, tmp_path_factory, first, second, every):
    """Writer A snapshots and commits; writer B (another host) adopts A's chain and snapshots it
    with its own compactor, which reads A's objects from storage."""
    options = location()
    ops: list[Op] = []
    full: list[dict[str, Any]] = []
    committed: dict[str, Any] | None = None
    for flushes in (first, second):
        system, log = open_log(options, tmp_path_factory.mktemp("host"), snapshot_every=every)
        log.adopt(committed)
        for batch in flushes:
            log.append_many(map(record, batch))
            ops += batch
            log.flush()
            if batch:
                full.append(log.chain().deltas[-1].to_json())
            log.wait_for_snapshot()
            committed = log.manifest()
        assert log.compactor_snapshots == log.snapshots_written
        log.close()
        system.close()
    assert committed is not None
    replay = {**committed, "snapshot": None, "deltas": full}
    system = ObjectStoreChangelogSystem(options, tmp_path_factory.mktemp("reader"))
    for manifest in (committed, replay):
        reader = system.reader("s", 0)
        reader.adopt(manifest)
        assert chain_state(reader) == model(ops)
        assert reader.end_offset() == len(ops)
    system.close()


# ---------------------------------------------------------------- the compactor killed

def test_the_compactor_killed_mid_snapshot_loses_nothing(objectstore_options, tmp_path, caplog):
    system, log = open_log(objectstore_options, tmp_path / "a", snapshot_every=2)
    log.adopt(None)
    ops: list[Op] = []

    def commit(number: int) -> dict[str, Any]:
        batch = [(i % 37, None if i % 11 == 0 else number * 1000 + i) for i in range(number * 13, number * 13 + 90)]
        log.append_many(map(record, batch))
        ops.extend(batch)
        log.flush()
        return log.manifest()

    for number in range(2):
        commit(number)
    log.wait_for_snapshot()
    first = commit(2)
    assert first["snapshot"] is not None and log.compactor_snapshots == 1
    pid = log.compactor_pid
    assert pid is not None
    os.kill(pid, signal.SIGSTOP)  # the child stops: the next snapshot request waits, unanswered
    try:
        commit(3)  # this flush asks for a snapshot
        assert not log._snapshotting.done()  # noqa: SLF001 - the request is in flight
    finally:
        os.kill(pid, signal.SIGKILL)
    log.wait_for_snapshot()
    assert gone(pid) and log.compactor_pid is None
    assert any("compactor subprocess failed" in r.getMessage() for r in caplog.records)
    # The request the child never answered was built in-process instead (reading the child's last
    # snapshot back from storage), and so are the later ones.
    committed = commit(4)
    assert committed["snapshot"]["end"] == 4 * 90 and log.compactor_snapshots == 1
    for number in range(5, 9):
        log.wait_for_snapshot()
        committed = commit(number)
    assert committed["snapshot"]["end"] > 4 * 90
    assert log.snapshots_written > log.compactor_snapshots == 1
    stored = {info.key.split("/", 3)[3]: info.size for info in system.objects("s", 0)}
    named = [item for item in [committed["snapshot"], *committed["deltas"]]]
    assert all(stored.get(item["object"]) == item["bytes"] for item in named)
    log.close()
    system.close()
    # The next run (another host, nothing local) restores exactly.
    again, log = open_log(objectstore_options, tmp_path / "b", snapshot_every=2)
    log.adopt(committed)
    assert chain_state(log) == model(ops)
    commit(9)
    log.wait_for_snapshot()
    reader = again.reader("s", 0)
    reader.adopt(commit(10))
    assert chain_state(reader) == model(ops)
    log.close()
    again.close()


# ---------------------------------------------------------------- the writer killed

WRITER = """
import json, os, signal, sys, time
from pathlib import Path
from localstate.changelog.objectstore import ObjectStoreChangelogSystem
params = json.loads(sys.argv[1])
system = ObjectStoreChangelogSystem({**params["options"], "snapshot_every": 1}, Path(params["root"]))
system.ensure_stream("s", 1)
log = system.partition("s", 0)
log.adopt(None)
log.append(b"k", b"v")
log.flush()
log.wait_for_snapshot()
log.manifest()
assert log.compactor_snapshots == 1
if params["fork"] and os.fork() == 0:  # a forked process keeps an inherited copy of the compactor's pipe
    time.sleep(120)
    os._exit(0)
print(json.dumps({"compactor": log.compactor_pid}), flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.parametrize("fork", [False, True], ids=["plain", "pipe-held-by-a-fork"])
def test_a_killed_writer_leaves_no_compactor_behind(objectstore_options, tmp_path, fork):
    params = {"options": objectstore_options, "root": str(tmp_path), "fork": fork}
    writer = subprocess.Popen([sys.executable, "-c", WRITER, json.dumps(params)], stdout=subprocess.PIPE,
                              text=True, start_new_session=True)
    try:
        line = writer.stdout.readline()
        assert writer.wait(timeout=120) == -signal.SIGKILL
        pid = json.loads(line)["compactor"]
        assert isinstance(pid, int)
        assert "localstate.changelog.objectstore.compactor" in _cmdline(pid) or gone(pid)
        assert wait_until_gone(pid), f"compactor {pid} outlived its writer"
    finally:
        try:
            os.killpg(writer.pid, signal.SIGKILL)  # the forked sleeper, if any
        except ProcessLookupError:
            pass


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except FileNotFoundError:
        return ""


# ---------------------------------------------------------------- never an unwritten object

def test_no_manifest_names_an_unwritten_object(objectstore_options, tmp_path):
    system, log = open_log(objectstore_options, tmp_path, snapshot_every=1)
    log.adopt(None)
    snapshots = set()
    for round_ in range(16):
        log.append_many((b"k%d" % (i % 300), b"%d" % round_) for i in range(round_ * 50, round_ * 50 + 400))
        log.flush()  # the delta PUT starts here; a snapshot request goes to the compactor
        if round_ % 4 == 3:
            log.wait_for_snapshot()
        manifest = log.manifest()  # waits for the PUT; names a snapshot only once the child wrote it
        named = [item for item in [manifest["snapshot"], *manifest["deltas"]] if item is not None]
        stored = {info.key.split("/", 3)[3]: info.size for info in system.objects("s", 0)}
        assert named and all(stored.get(item["object"]) == item["bytes"] for item in named)
        if manifest["snapshot"] is not None:
            snapshots.add(manifest["snapshot"]["object"])
    assert snapshots and log.compactor_snapshots >= len(snapshots)
    log.close()
    system.close()


def test_the_compactor_option_is_checked(tmp_path):
    with pytest.raises(ConfigError, match="compactor"):
        ObjectStoreChangelogSystem({"url": str(tmp_path), "compactor": "fork"}, tmp_path)
