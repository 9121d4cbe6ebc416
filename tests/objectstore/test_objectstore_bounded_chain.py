"""Issue #33 part 3, "live for weeks": the objectstore chain a checkpoint names is bounded by
``snapshot_every``, counted from the committed chain, also when every commit is made by a writer
opened fresh (as on a cluster, where each batch opens the partition anew); garbage collection then
deletes what the snapshots superseded, so storage follows live state, not the job's age.
Runs on a shared directory and on SeaweedFS."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from localstate.changelog.objectstore import ObjectStoreChangelogSystem
from localstate.core.checkpoint import Checkpoint

from .test_objectstore_changelog import chain_state, expected_state

EVERY = 5
BATCHES = 20
KEYS = 12


@pytest.mark.parametrize("compactor", ["thread", "process"])
def test_a_writer_opened_fresh_for_every_commit_keeps_the_chain_bounded(objectstore_options: dict[str, Any],
                                                                        tmp_path: Path, compactor: str):
    system = ObjectStoreChangelogSystem({**objectstore_options, "snapshot_every": EVERY, "compactor": compactor,
                                         "gc_keep": 1}, tmp_path)
    system.ensure_stream("s", 1)
    checkpoints = system.checkpoint_objects("job")
    manifest = None
    ops: list[tuple[bytes, bytes | None]] = []
    tails, snapshots = [], set()
    for batch in range(BATCHES):
        log = system.partition("s", 0)  # open -> adopt -> flush -> manifest -> close, every batch
        log.adopt(manifest)
        records = [(f"k{i}".encode(), None if (i + batch) % 5 == 0 else f"{batch}".encode()) for i in range(KEYS)]
        ops += records
        log.append_many(records)
        log.flush()
        manifest = log.manifest()
        log.close()
        checkpoints.put(0, Checkpoint(0, changelogs={"st": manifest["end"]}, manifests={"st": manifest})
                        .to_json().encode())
        tails.append(len(manifest["deltas"]))
        if manifest["snapshot"] is not None:
            snapshots.add(manifest["snapshot"]["object"])
    assert max(tails) <= EVERY, tails
    assert len(snapshots) >= BATCHES // EVERY - 1, tails
    # The pacing follows the committed chain: the tail grows by one delta per batch until it holds
    # snapshot_every, then a snapshot takes it (at that flush, or at the next writer's adopt).
    assert tails[:EVERY - 1] == list(range(1, EVERY)) and tails[EVERY] <= 1, tails
    # Snapshot plus tail is the whole history's state.
    reader = system.reader("s", 0)
    reader.adopt(manifest)
    assert chain_state(reader) == expected_state(ops)
    # Garbage collection (grace 0) deletes every object the last checkpoint does not name: what is
    # stored is the live chain, not the history.
    collector = ObjectStoreChangelogSystem({**objectstore_options, "gc_keep": 1, "gc_grace": 0}, tmp_path)
    collector.collect_garbage("s")
    named = {manifest["snapshot"]["object"]} | {delta["object"] for delta in manifest["deltas"]}
    stored = {info.key.split("/", 3)[3] for info in system.objects("s", 0)}
    assert stored == named and len(stored) <= EVERY + 1
    system.close()
    collector.close()


def test_a_chain_left_too_long_is_snapshotted_at_the_next_open(objectstore_options: dict[str, Any], tmp_path: Path):
    """A chain written before the fix (a checkpoint naming every delta since the start) is compacted
    by the first writer that adopts it: its first manifest names a snapshot plus its own delta."""
    long_lived = ObjectStoreChangelogSystem({**objectstore_options, "snapshot_every": 1000}, tmp_path)
    long_lived.ensure_stream("s", 1)
    log = long_lived.partition("s", 0)
    ops = []
    for batch in range(12):
        records = [(f"k{i}".encode(), f"{batch}".encode()) for i in range(KEYS)]
        ops += records
        log.append_many(records)
        log.flush()
    old = log.manifest()
    log.close()
    assert old["snapshot"] is None and len(old["deltas"]) == 12
    system = ObjectStoreChangelogSystem({**objectstore_options, "snapshot_every": EVERY, "compactor": "thread"},
                                        tmp_path)
    fresh = system.partition("s", 0)
    fresh.adopt(old)
    fresh.append(b"k0", b"last")
    fresh.flush()
    manifest = fresh.manifest()
    fresh.close()
    assert manifest["snapshot"] is not None and manifest["snapshot"]["end"] == old["end"]
    assert [delta["start"] for delta in manifest["deltas"]] == [old["end"]]
    reader = system.reader("s", 0)
    reader.adopt(manifest)
    assert chain_state(reader) == expected_state(ops + [(b"k0", b"last")])
    long_lived.close()
    system.close()


def test_a_long_lived_writer_never_names_more_than_snapshot_every_deltas(objectstore_options: dict[str, Any],
                                                                          tmp_path: Path):
    """In-process (one writer for the whole run): the manifest waits for a snapshot still being built
    rather than name a longer tail."""
    system = ObjectStoreChangelogSystem({**objectstore_options, "snapshot_every": 3, "compactor": "thread"}, tmp_path)
    system.ensure_stream("s", 1)
    log = system.partition("s", 0)
    ops, tails = [], []
    for batch in range(20):
        records = [(f"k{i}".encode(), f"{batch}".encode()) for i in range(KEYS)]
        ops += records
        log.append_many(records)
        log.flush()
        tails.append(len(log.manifest()["deltas"]))
    assert max(tails) <= 3 and log.snapshots_written >= 5, tails
    log.close()
    system.close()
