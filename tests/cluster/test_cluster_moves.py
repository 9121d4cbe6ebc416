"""Real two-worker standalone cluster (loopback), the driver in a process of its own.

- a whole worker (JVMs and Python workers) is killed mid-batch: its partitions move to the other
  worker and are rebuilt there (from the file changelog on a shared directory, or from the
  objectstore changelog on SeaweedFS: snapshot plus tail); the worker comes back (same directories) and takes partitions
  again, validating its old local state against the committed checkpoint; outputs and state exact;
- a healthy run keeps each partition on the executor holding its warm local state (warm hit rate);
- a zombie: a host paused mid-task (SIGSTOP) is declared lost, its partition commits elsewhere,
  then it resumes; the Kafka changelog fences its writes, outputs and state stay exact.
"""

from __future__ import annotations

import json
import sys
import uuid
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from jobs import PARTITIONS, check_exact, wait_for, write_job  # noqa: E402

pytestmark = [pytest.mark.cluster, pytest.mark.spark]

BATCH = 300  # records per partition and batch: 8 batches


def _durable(request, tmp_path: Path) -> tuple[str, str]:
    """``(changelog system, its [changelogs.*] section)`` of the test's ``durable`` parameter: the
    file changelog on the shared directory, or the objectstore changelog on SeaweedFS (S3), with a
    snapshot every 2 commits so that a moved partition loads a snapshot and replays the tail."""
    if request.param == "file":
        return "file", "[changelogs.file]\nfsync = false"
    options = request.getfixturevalue("seaweed").options(f"cluster-{uuid.uuid4().hex[:10]}", snapshot_every=2)
    body = "\n".join(f"{key} = {json.dumps(value)}" for key, value in options.items())
    return "objectstore", f"[changelogs.objectstore]\n{body}"


# The file changelog in the default run; the objectstore one is the slow soak (`-m slow`): a moved
# partition rebuilt from a snapshot and its tail on SeaweedFS is test_cluster_snapshots.py's, in the
# default run.
@pytest.fixture(params=["file", pytest.param("seaweedfs", marks=pytest.mark.slow)])
def durable(request, tmp_path):
    return _durable(request, tmp_path)


def test_worker_killed_mid_batch_moves_partitions_then_returns(tmp_path, spark_cluster, start_driver, durable):
    shared = tmp_path / "shared"  # shared directory: file changelogs (file), outputs, checkpoints (file)
    changelog, section = durable
    job_file = write_job(tmp_path / "job", spark_cluster.url, state_dir=shared / "state", changelog=changelog,
                         local_dir="${LOCALSTATE_TEST_HOST_DIR}", extra=section)
    gate = job_file.parent / "gate"
    driver = start_driver(job_file, BATCH)

    healthy = driver.ask({"run": 2})
    assert healthy.get("batches") == 2, healthy
    assert len({home[0] for home in healthy["homes"].values()}) == 2  # both executors hold partitions

    victim = 1
    (gate / f"hold-{victim}").touch()
    driver.send({"run": 1})
    reached = wait_for(f"reached-{victim}-*", gate)
    worker = spark_cluster.worker_of(reached.read_text())
    worker_home = healthy["homes"][str(victim)][0]
    worker.kill()  # the whole host, mid-batch: its task of partition 1 dies half-way
    (gate / f"hold-{victim}").unlink()
    moved = driver.answer()
    assert moved.get("batches") == 1, moved
    survivor = moved["homes"][str(victim)][0]
    assert survivor != worker_home
    assert set(home[0] for home in moved["homes"].values()) == {survivor}  # every partition moved there
    assert moved["replayed"] > 0  # the moved partitions were rebuilt from the changelog
    # Why the victim's attempt failed, from Spark's status store (no executor can leave it for the
    # driver on a cluster): the lost executor, on the killed host.
    reasons = moved["reasons"]
    assert len(reasons) == moved["failed_attempts"] >= 1, moved
    assert all(r["host"] and "recorded no reason" not in r["message"] for r in reasons), reasons
    assert any(r["partition"] == victim and r["type"] == "ExecutorLostFailure" for r in reasons), reasons

    alone = driver.ask({"run": 2})
    assert alone.get("batches") == 2, alone

    spark_cluster.start_worker(worker.name)  # the host returns, with its disks
    assert len(driver.ask({"executors": 2, "timeout": 120})["executors"]) == 2
    rest = driver.ask({"run": 100})
    assert rest.get("lag") == 0, rest
    homes = {home[0] for home in rest["homes"].values()}
    assert len(homes) == 2 and survivor in homes  # the returning host took its share again
    assert rest["replayed"] > 0  # and brought the local state it kept up to date (or rebuilt it)
    check_exact(job_file, tmp_path / "verify")
    # The returning host's stores live in its own directory, not in the shared one.
    assert list((worker.root / "host").glob("cluster-counts/stores/counts/*"))
    assert not (shared / "state" / "cluster-counts" / "stores").exists()


def test_healthy_run_keeps_partitions_warm(tmp_path, spark_cluster, start_driver):
    job_file = write_job(tmp_path / "job", spark_cluster.url, state_dir=tmp_path / "shared" / "state")
    driver = start_driver(job_file, BATCH)
    summary = driver.ask({"run": 100})
    assert summary.get("lag") == 0, summary
    assert summary["batches"] == 8
    # The first batch has no state to find; every later task should find its partition warm.
    assert summary["stateful"] == 7 * PARTITIONS
    assert summary["warm_fraction"] >= 0.95, summary
    assert summary["replayed"] == 0
    check_exact(job_file, tmp_path / "verify")
