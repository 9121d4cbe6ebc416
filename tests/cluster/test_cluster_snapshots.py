"""Issue #33, "live for weeks", on the real two-worker standalone cluster (loopback) with the
objectstore changelog on SeaweedFS (S3) and ``snapshot_every = 5``, over 20 batches run one at a
time. On a cluster every batch opens each partition's writer anew, so snapshots must be paced by the
committed chain, not by a writer's life:

- snapshot objects exist in the bucket, and the checkpoints name them;
- after every batch, every partition's checkpoint names at most 5 deltas after its snapshot;
- a whole host killed between two batches: its partitions move to the other worker and are rebuilt
  there from the snapshot plus its tail of deltas, never the whole history (the replayed record
  count is asserted against the checkpoint's manifest);
- outputs and state exact against plain Python at the end.
"""

from __future__ import annotations

import json
import sys
import uuid
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from jobs import EVENTS, PARTITIONS, check_exact, wait_for, write_job  # noqa: E402

from localstate.core.config import load_job_config  # noqa: E402
from localstate.runtime.layout import checkpoint_store, open_changelog_system  # noqa: E402

pytestmark = [pytest.mark.cluster, pytest.mark.spark]

EVERY = 5
BATCHES = 20
BATCH = EVENTS // BATCHES  # records per partition and batch
MOVE_AFTER = 12  # the host is killed after this many batches (the chains hold snapshots by then)


def _manifests(job) -> dict[int, dict]:
    """Each partition's committed manifest of store ``counts`` (from its latest checkpoint)."""
    checkpoints = checkpoint_store(job)
    out = {}
    for partition in range(PARTITIONS):
        checkpoint = checkpoints.load(partition)
        assert checkpoint is not None, f"partition {partition} has no checkpoint"
        out[partition] = checkpoint.manifests["counts"]
    return out


def _check_chains(manifests: dict[int, dict], batches: int) -> None:
    """At most EVERY deltas after the snapshot; with more commits than that, a snapshot exists."""
    for partition, manifest in manifests.items():
        deltas = manifest["deltas"]
        assert len(deltas) <= EVERY, (batches, partition, [d["object"] for d in deltas])
        if batches > EVERY:
            assert manifest["snapshot"] is not None, (batches, partition, manifest)
        covered = (manifest["snapshot"]["end"] if manifest["snapshot"] else 0)
        assert [(d["start"], d["end"]) for d in deltas] == list(zip([covered] + [d["end"] for d in deltas[:-1]],
                                                                     [d["end"] for d in deltas]))
        assert (deltas[-1]["end"] if deltas else covered) == manifest["end"]


def test_snapshots_bound_every_chain_and_a_moved_partition_replays_only_its_tail(tmp_path, spark_cluster,
                                                                                 start_driver, seaweed):
    options = seaweed.options(f"snapshots-{uuid.uuid4().hex[:10]}", snapshot_every=EVERY)
    section = "[changelogs.objectstore]\n" + "\n".join(f"{k} = {json.dumps(v)}" for k, v in options.items())
    job_file = write_job(tmp_path / "job", spark_cluster.url, state_dir=tmp_path / "shared" / "state",
                         changelog="objectstore", local_dir="${LOCALSTATE_TEST_HOST_DIR}", extra=section)
    job = load_job_config(job_file)
    gate = job_file.parent / "gate"
    driver = start_driver(job_file, BATCH)

    named_snapshots: set[tuple[int, str]] = set()
    for batch in range(MOVE_AFTER - 1):
        answer = driver.ask({"run": 1})
        assert answer.get("batches") == 1 and answer["replayed"] == 0, answer
        manifests = _manifests(job)
        _check_chains(manifests, batch + 1)
        named_snapshots |= {(p, m["snapshot"]["object"]) for p, m in manifests.items() if m["snapshot"]}

    # Batch MOVE_AFTER - 1, with partition `victim` held at its first record to learn its host; the
    # batch then completes, and that whole host is killed between two batches.
    victim = 1
    (gate / f"hold-{victim}").touch()
    driver.send({"run": 1})
    worker = spark_cluster.worker_of(wait_for(f"reached-{victim}-*", gate).read_text())
    (gate / f"hold-{victim}").unlink()
    before = driver.answer()
    assert before.get("batches") == 1, before
    manifests = _manifests(job)
    _check_chains(manifests, MOVE_AFTER)
    lost_executor = before["homes"][str(victim)][0]
    moving = sorted(int(p) for p, home in before["homes"].items() if home[0] == lost_executor)
    assert victim in moving and len(moving) < PARTITIONS, before["homes"]
    worker.kill()

    moved = driver.ask({"run": 1})
    assert moved.get("batches") == 1, moved
    assert all(moved["homes"][str(p)][0] != lost_executor for p in moving), moved["homes"]
    # The moved partitions were rebuilt from their snapshot and its tail: what the committed manifests
    # name, which is far less than every record their changelogs ever held.
    tail = sum((manifests[p]["snapshot"]["records"] if manifests[p]["snapshot"] else 0)
               + sum(d["records"] for d in manifests[p]["deltas"]) for p in moving)
    history = sum(manifests[p]["end"] for p in moving)
    assert 0 < moved["replayed"] <= tail, (moved["replayed"], tail)
    assert tail < history / 2, (tail, history)
    _check_chains(_manifests(job), MOVE_AFTER + 1)

    for batch in range(MOVE_AFTER + 1, BATCHES):
        answer = driver.ask({"run": 1})
        assert answer.get("batches") == 1, answer
        manifests = _manifests(job)
        _check_chains(manifests, batch + 1)
        named_snapshots |= {(p, m["snapshot"]["object"]) for p, m in manifests.items() if m["snapshot"]}
    assert driver.ask({"run": 1}).get("lag") == 0  # every record was in the 20 batches

    # The snapshots are objects in the bucket, one series per partition, and the latest checkpoints'
    # snapshots are among them (garbage collection may have deleted superseded ones since).
    system = open_changelog_system(job)
    try:
        stream = job.stores["counts"].changelog
        in_bucket = {(p, info.key.rsplit("/", 1)[1]) for p in range(PARTITIONS) for info in system.objects(stream, p)
                     if "/snapshots/" in info.key}
    finally:
        system.close()
    assert {p for p, _ in in_bucket} == set(range(PARTITIONS)), in_bucket
    latest = {(p, m["snapshot"]["object"].rsplit("/", 1)[-1]) for p, m in _manifests(job).items()}
    assert latest <= in_bucket, (latest, in_bucket)
    assert len(named_snapshots) >= PARTITIONS * (BATCHES // EVERY - 1)  # a new snapshot every few batches
    check_exact(job_file, tmp_path / "verify")
