"""The ``objectstore`` changelog system: the changelog contract (shared with the file and memory
systems), immutable objects verified against the manifest, snapshots + tail equal to a full replay,
garbage collection. Runs on a local shared directory and on a real S3 server (SeaweedFS)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from localstate.changelog.file import FileChangelogSystem
from localstate.changelog.memory import MemoryChangelogSystem
from localstate.changelog.objectstore import ObjectStoreChangelogSystem
from localstate.changelog.objectstore.compaction import compact_objects
from localstate.core.changelog import Compactable, DeletableStreams, ManifestedChangelog, StreamLocations
from localstate.core.checkpoint import Checkpoint
from localstate.errors import ChangelogCorruptError, ChangelogError, CheckpointError, ConfigError


# ---------------------------------------------------------------- the changelog contract, every system

@pytest.fixture(params=["file", "memory", "objectstore-dir", "objectstore-s3"])
def system(request: pytest.FixtureRequest, tmp_path: Path):
    kind = request.param
    if kind == "file":
        made = FileChangelogSystem({}, tmp_path)
    elif kind == "memory":
        made = MemoryChangelogSystem()
    elif kind == "objectstore-dir":
        made = ObjectStoreChangelogSystem({"url": str(tmp_path / "shared")}, tmp_path)
    else:
        made = ObjectStoreChangelogSystem(request.getfixturevalue("seaweed").options(f"contract-{os.getpid()}-"
                                                                                     f"{time.monotonic_ns()}"),
                                          tmp_path)
    yield made
    made.close()


def reopen(system, partition):
    """Close ``partition`` and open it again as a restarted writer would (from its manifest, when the
    system names committed objects in checkpoints)."""
    manifest = partition.manifest() if isinstance(partition, ManifestedChangelog) else None
    if not isinstance(system, MemoryChangelogSystem):
        partition.close()
    again = system.partition(partition.stream, partition.partition)
    if isinstance(again, ManifestedChangelog):
        again.adopt(manifest)
    return again


def test_contract_append_flush_read_reopen(system):
    system.ensure_stream("s", 2)
    log = system.partition("s", 1)
    assert log.end_offset() == 0
    log.append(b"a", b"1")
    log.append_many([(b"b", b"2"), (b"a", None), (b"c", b"")])
    assert log.end_offset() == 4
    assert log.flush() == 4
    log.append(b"d", b"4")
    assert log.flush() == 5
    assert log.flush() == 5  # nothing buffered: nothing written
    records = [(r.key, r.value, r.offset) for r in log.read()]
    assert records == [(b"a", b"1", 0), (b"b", b"2", 1), (b"a", None, 2), (b"c", b"", 3), (b"d", b"4", 4)]
    assert [r.offset for r in log.read(1, 3)] == [1, 2]
    assert [r.offset for batch in log.read_batches(3) for r in batch] == [3, 4]
    again = reopen(system, log)
    assert again.end_offset() == 5
    assert [(r.key, r.value, r.offset) for r in again.read()] == records
    again.append(b"e", b"5")
    assert again.flush() == 6
    assert [r.offset for r in again.read(5)] == [5]


def test_contract_bad_record_keeps_the_ones_before(system):
    system.ensure_stream("s", 1)
    log = system.partition("s", 0)
    if isinstance(system, MemoryChangelogSystem):
        pytest.skip("the memory changelog does not validate records")
    with pytest.raises(ChangelogError):
        log.append_many([(b"ok", b"1"), ("not bytes", b"2")])
    assert log.end_offset() == 1
    assert log.flush() == 1
    assert [r.key for r in log.read()] == [b"ok"]


def test_objectstore_offers_the_capabilities(objectstore_options, tmp_path):
    system = ObjectStoreChangelogSystem(objectstore_options, tmp_path)
    assert isinstance(system, Compactable) and isinstance(system, DeletableStreams)
    assert isinstance(system, StreamLocations)
    system.ensure_stream("s", 1)
    assert isinstance(system.partition("s", 0), ManifestedChangelog)
    with pytest.raises(ChangelogError, match="partitions"):
        system.ensure_stream("s", 3)


# ---------------------------------------------------------------- objects, manifests, verification

def os_system(options: dict[str, Any], tmp_path: Path, **extra: Any) -> ObjectStoreChangelogSystem:
    return ObjectStoreChangelogSystem({**options, **extra}, tmp_path)


def test_each_flush_is_one_new_object_and_nothing_is_overwritten(objectstore_options, tmp_path):
    system = os_system(objectstore_options, tmp_path)
    system.ensure_stream("s", 1)
    log = system.partition("s", 0)
    seen: dict[str, int] = {}
    for round_ in range(4):
        log.append_many((f"k{i}".encode(), f"{round_}".encode()) for i in range(10))
        log.flush()
        log.settle()  # flush starts the PUT; settle (or manifest) waits for it
        for info in system.objects("s", 0):
            assert seen.setdefault(info.key, info.size) == info.size  # never rewritten
    names = sorted(info.key.rsplit("/", 1)[1] for info in system.objects("s", 0))
    assert len(names) == 4 and all(name.endswith(f"-{log.writer}.delta") for name in names)
    manifest = log.manifest()
    assert [d["object"].split("/")[1][:41] for d in manifest["deltas"]] == [
        f"{i * 10:020d}-{i * 10 + 10:020d}" for i in range(4)]


def test_a_reader_sees_only_what_the_manifest_names(objectstore_options, tmp_path):
    system = os_system(objectstore_options, tmp_path)
    system.ensure_stream("s", 1)
    writer = system.partition("s", 0)
    writer.append(b"a", b"committed")
    writer.flush()
    committed = writer.manifest()
    writer.append(b"a", b"orphan")  # flushed but never named by a checkpoint (a crash before it)
    writer.flush()
    writer.settle()
    reader = system.partition("s", 0)
    reader.adopt(committed)
    assert [(r.key, r.value) for r in reader.read()] == [(b"a", b"committed")]
    assert reader.end_offset() == 1
    assert len(system.objects("s", 0)) == 2  # the orphan exists, invisibly


def committed_partition(options, tmp_path):
    system = os_system(options, tmp_path)
    system.ensure_stream("s", 1)
    log = system.partition("s", 0)
    for round_ in range(3):
        log.append_many((f"k{i}".encode(), f"v{round_}".encode()) for i in range(20))
        log.flush()
    return system, log.manifest()


def test_missing_object_named_by_the_manifest_is_a_typed_error_naming_it(objectstore_options, tmp_path):
    system, manifest = committed_partition(objectstore_options, tmp_path)
    victim = manifest["deltas"][1]["object"]
    system.store.delete(f"changelogs/s/0/{victim}")
    reader = system.partition("s", 0)
    reader.adopt(manifest)
    with pytest.raises(ChangelogError, match="missing") as caught:
        list(reader.read())
    assert victim in str(caught.value) and caught.value.context["offset"] == 20


@pytest.mark.parametrize("damage", ["flip", "truncate", "stray-tail", "swap-writer"])
def test_damaged_object_is_a_corrupt_error_naming_it(objectstore_options, tmp_path, damage):
    system, manifest = committed_partition(objectstore_options, tmp_path)
    victim = manifest["deltas"][2]["object"]
    key = f"changelogs/s/0/{victim}"
    data = bytearray(system.store.get(key))
    if damage == "flip":
        data[-3] ^= 0x40
    elif damage == "truncate":
        manifest["deltas"][2]["bytes"] = len(data) - 5  # the manifest matches, the records do not
        data = data[:-5]
    elif damage == "stray-tail":  # bytes after the last record, fewer than a record header
        manifest["deltas"][2]["bytes"] = len(data) + 3
        data += b"\x00\x01\x02"
    else:
        data[7:23] = bytes(16)  # another writer's token in the header
    system.store.delete(key)
    system.store.put(key, bytes(data))
    reader = system.partition("s", 0)
    reader.adopt(manifest)
    assert [r.offset for r in reader.read(0, 40)] == list(range(40))  # the intact objects still read
    with pytest.raises(ChangelogCorruptError) as caught:
        list(reader.read())
    assert victim in str(caught.value)


def test_malformed_manifest_is_refused(objectstore_options, tmp_path):
    system, manifest = committed_partition(objectstore_options, tmp_path)
    reader = system.partition("s", 0)
    escaping = {**manifest, "deltas": [{**manifest["deltas"][0], "object": "../../../etc/passwd"}] + manifest["deltas"][1:]}
    gap = {**manifest, "deltas": manifest["deltas"][1:]}
    for bad in (escaping, gap, {**manifest, "end": 7}, {**manifest, "format": 9}, {**manifest, "partition": 3}):
        with pytest.raises(ChangelogError):
            reader.adopt(bad)


def test_unknown_option_and_missing_url_are_config_errors(tmp_path):
    with pytest.raises(ConfigError, match=r"changelogs\.objectstore\.url"):
        ObjectStoreChangelogSystem({}, tmp_path)
    with pytest.raises(ConfigError, match="snapshot_evry"):
        ObjectStoreChangelogSystem({"url": str(tmp_path), "snapshot_evry": 3}, tmp_path)
    with pytest.raises(ConfigError, match="snapshot_every"):
        ObjectStoreChangelogSystem({"url": str(tmp_path), "snapshot_every": 0}, tmp_path)


def test_old_checkpoints_without_manifests_still_load():
    text = '{"format": 1, "partition": 2, "generation": 3, "inputs": {"in": 5}, "changelogs": {"c": 9}}'
    assert Checkpoint.from_json(text, "old.json").manifests == {}
    checkpoint = Checkpoint(2, manifests={"c": {"format": 1}})
    assert Checkpoint.from_json(checkpoint.to_json(), "new.json") == checkpoint
    import json

    assert "manifests" not in json.loads(Checkpoint(2).to_json())  # other systems' checkpoints unchanged
    with pytest.raises(CheckpointError, match="manifests"):
        Checkpoint.from_json(text[:-1] + ', "manifests": {"c": 7}}', "bad.json")


# ---------------------------------------------------------------- snapshots and tail

def expected_state(ops):
    """Each live key's last value after the (key, value) ``ops``; a None value deletes the key."""
    state: dict[bytes, bytes] = {}
    for key, value in ops:
        if value is None:
            state.pop(key, None)
        else:
            state[key] = value
    return state


def chain_state(log) -> dict[bytes, bytes]:
    """What replaying ``log``'s records from its start gives: each live key's last value."""
    return expected_state((record.key, record.value) for record in log.read())


def test_snapshot_replaces_the_deltas_it_covers(objectstore_options, tmp_path):
    system = os_system(objectstore_options, tmp_path, snapshot_every=3)
    system.ensure_stream("s", 1)
    log = system.partition("s", 0)
    ops = []
    for round_ in range(7):
        batch = [(f"k{i}".encode(), None if (i + round_) % 4 == 0 else f"{round_}".encode()) for i in range(25)]
        ops += batch
        log.append_many(batch)
        log.flush()
        log.wait_for_snapshot()
        manifest = log.manifest()
    assert manifest["snapshot"] is not None and manifest["snapshot"]["end"] == 150
    assert [d["start"] for d in manifest["deltas"]] == [150]
    # A host without local state: snapshot + tail, verified, equals the full history's state.
    fresh = system.partition("s", 0)
    fresh.adopt(manifest)
    assert chain_state(fresh) == expected_state(ops)
    snapshot_records = manifest["snapshot"]["records"]
    assert snapshot_records == len(expected_state(ops[:150]))  # last value per key, tombstones dropped
    assert fresh.compaction_horizon() == 150


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rounds=st.lists(st.lists(st.tuples(st.integers(0, 12), st.one_of(st.none(), st.binary(max_size=3))),
                                max_size=15), min_size=1, max_size=12),
       every=st.integers(1, 4))
def test_snapshot_plus_tail_equals_full_replay(tmp_path_factory, rounds, every):
    root = tmp_path_factory.mktemp("hyp")
    system = ObjectStoreChangelogSystem({"url": str(root / "shared"), "snapshot_every": every}, root)
    system.ensure_stream("s", 1)
    log = system.partition("s", 0)
    ops = []
    manifest = log.manifest()
    for batch in rounds:
        encoded = [(f"k{key}".encode(), value) for key, value in batch]
        ops += encoded
        log.append_many(encoded)
        log.flush()
        if len(ops) % 2:
            log.wait_for_snapshot()
        manifest = log.manifest()
    log.wait_for_snapshot()
    for current in (manifest, log.manifest()):
        fresh = system.partition("s", 0)
        fresh.adopt(current)
        assert fresh.end_offset() == len(ops)
        assert chain_state(fresh) == expected_state(ops)


def test_compact_objects_keeps_last_value_per_key_in_offset_order():
    from localstate.changelog.framing import encode_into

    first, second = bytearray(), bytearray()
    encode_into(first, [(b"a", b"1"), (b"b", b"1"), (b"c", b"1")], 0, 0)
    encode_into(second, [(b"a", b"2"), (b"b", None), (b"d", b"1")], 3, 0)
    body, count = compact_objects([bytes(first), bytes(second)])
    from localstate.changelog.framing import decode_records

    records, _pos, _next = decode_records(body, 0, len(body), 0, 10)
    assert count == 3 and [(r.key, r.value, r.offset) for r in records] == [
        (b"c", b"1", 2), (b"a", b"2", 3), (b"d", b"1", 5)]


# ---------------------------------------------------------------- garbage collection

def test_gc_deletes_only_unreferenced_objects_of_its_own_naming(objectstore_options, tmp_path):
    from localstate.changelog.objectstore.system import ObjectCheckpoints

    system = os_system(objectstore_options, tmp_path, snapshot_every=2, gc_keep=1)
    system.ensure_stream("s", 1)
    checkpoints = system.checkpoint_objects("job")
    assert isinstance(checkpoints, ObjectCheckpoints)
    log = system.partition("s", 0)
    ops = []
    for round_ in range(6):
        batch = [(f"k{i}".encode(), f"{round_}".encode()) for i in range(10)]
        ops += batch
        log.append_many(batch)
        log.flush()
        log.wait_for_snapshot()
        checkpoints.put(0, Checkpoint(0, changelogs={"st": log.end_offset()},
                                      manifests={"st": log.manifest()}).to_json().encode())
    orphan = system.partition("s", 0)  # a crashed attempt: flushed, never committed
    orphan.adopt(log.manifest())
    orphan.append(b"zombie", b"x")
    orphan.flush()
    orphan.settle()
    foreign = "changelogs/s/0/deltas/notes.txt"
    system.store.put(foreign, b"not ours")
    committed = log.manifest()
    named = {item["object"] for item in committed["deltas"]} | {committed["snapshot"]["object"]}
    before = {info.key.split("/", 3)[3] for info in system.objects("s", 0)}
    assert named < before and len(before) > len(named) + 1
    assert system.collect_garbage("s").segments_deleted == 0  # everything is within the grace period
    collector = os_system(objectstore_options, tmp_path, gc_keep=1, gc_grace=0)
    stats = collector.collect_garbage("s")
    after = {info.key.split("/", 3)[3] for info in system.objects("s", 0)}
    assert after == named and stats.segments_deleted == len(before) - len(named)
    assert system.store.get(foreign) == b"not ours"
    fresh = system.partition("s", 0)
    fresh.adopt(committed)
    assert chain_state(fresh) == expected_state(ops)


def test_checkpoint_objects_latest_wins_and_old_ones_go(objectstore_options, tmp_path):
    system = os_system(objectstore_options, tmp_path, gc_keep=2)
    checkpoints = system.checkpoint_objects("job")
    assert checkpoints.latest(0) is None
    for generation in range(6):
        checkpoints.put(0, Checkpoint(0, generation=generation).to_json().encode())
    where, data = checkpoints.latest(0)
    assert Checkpoint.from_json(data.decode(), where).generation == 5
    assert len(checkpoints._list(0)) == 3  # gc_keep + 1
    checkpoints.delete_partition(0)
    assert checkpoints.latest(0) is None


def test_delete_stream_removes_its_objects_only(objectstore_options, tmp_path):
    system, _manifest = committed_partition(objectstore_options, tmp_path)
    system.store.put("changelogs/s/README", b"operator's")
    assert system.delete_stream("s") is True
    assert system.objects("s", 0) == []
    assert system.store.get("changelogs/s/README") == b"operator's"
    assert system.delete_stream("s") is False


def test_a_snapshot_not_named_in_time_is_dropped(objectstore_options, tmp_path):
    """Garbage collection may delete an unnamed object once it is gc_grace old, so a snapshot that
    waited more than half of that for a commit is never named."""
    system = os_system(objectstore_options, tmp_path, snapshot_every=1, gc_grace=0)
    system.ensure_stream("s", 1)
    log = system.partition("s", 0)
    log.append(b"k", b"v")
    log.flush()
    log.wait_for_snapshot()
    manifest = log.manifest()
    assert manifest["snapshot"] is None and len(manifest["deltas"]) == 1
    assert log.snapshots_written == 0


def test_any_fsspec_file_system_works(tmp_path):
    pytest.importorskip("fsspec")
    import uuid

    system = ObjectStoreChangelogSystem({"url": f"memory://localstate-{uuid.uuid4().hex}/x"}, tmp_path)
    system.ensure_stream("s", 1)
    log = system.partition("s", 0)
    log.append_many([(b"a", b"1"), (b"b", None)])
    log.flush()
    reader = system.partition("s", 0)
    reader.adopt(log.manifest())
    assert [(r.key, r.value) for r in reader.read()] == [(b"a", b"1"), (b"b", None)]
    # The memory file system records no modification times: garbage collection keeps what it cannot date.
    orphan = system.partition("s", 0)
    orphan.append(b"z", b"9")
    orphan.flush()
    orphan.settle()  # flush starts the PUT; settle waits for it
    assert ObjectStoreChangelogSystem({"url": system.config["url"], "gc_grace": 0}, tmp_path).collect_garbage(
        "s").segments_deleted == 0
    assert len(system.objects("s", 0)) == 2
