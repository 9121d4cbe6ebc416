"""Real two-worker standalone cluster (loopback), the driver in a process of its own: the failures
``test_cluster_moves`` does not cover.

- a worker is killed after its task wrote the whole batch (changelog records flushed, outputs
  appended) but before the task returned: the retry elsewhere trims those records and truncates
  those outputs; the returning host's copy of them is rebuilt;
- a zombie on the objectstore changelog (SeaweedFS): a host frozen mid-task, its partition commits
  elsewhere, then it resumes and writes its deltas: the committed checkpoint never names them;
- the driver is killed mid-batch and a new driver runs the same job: it resumes from the committed
  checkpoints.
Each test ends exact against the plain-Python answer (outputs and state). They share the session's
cluster with the other cluster tests.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
import uuid
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from jobs import EVENTS, PARTITIONS, actual_outputs, check_exact, freeze_host_mid_batch, pid_of, \
    wait_for, write_job  # noqa: E402

from localstate.core.config import load_job_config  # noqa: E402
from localstate.runtime.layout import checkpoint_store, open_changelog_system

pytestmark = [pytest.mark.cluster, pytest.mark.spark]

BATCH = 600  # records per partition and batch: 4 batches


def _wait_gone(pid: int, timeout: float = 60.0) -> None:
    """Wait until process ``pid`` is gone, at most ``timeout`` seconds."""
    _wait_for_file(None, None, pid, timeout)


def _wait_for_file(directory: Path | None, name: str | None, pid: int, timeout: float) -> Path | None:
    """The file ``directory/name`` once it exists; None if process ``pid`` (which writes it) is gone
    or ``timeout`` seconds pass first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if directory is not None and (directory / name).exists():
            return directory / name
        if not Path(f"/proc/{pid}").exists():
            return None
        time.sleep(0.1)
    return None


def _named(manifest: dict, keys: set[str]) -> set[str]:
    """The object keys among ``keys`` a checkpoint's changelog manifest names."""
    text = json.dumps(manifest)
    return {key for key in keys if key.rsplit("/", 1)[-1] in text}


def _file_job(tmp_path: Path, master: str) -> Path:
    return write_job(tmp_path / "job", master, state_dir=tmp_path / "shared" / "state",
                     local_dir="${LOCALSTATE_TEST_HOST_DIR}", extra="[changelogs.file]\nfsync = false")


def test_worker_killed_after_its_task_wrote_the_batch(tmp_path, spark_cluster, start_driver):
    job_file = _file_job(tmp_path, spark_cluster.url)
    gate = job_file.parent / "gate"
    job = load_job_config(job_file)
    driver = start_driver(job_file, BATCH)
    assert driver.ask({"run": 1}).get("batches") == 1

    victim = 1
    committed = checkpoint_store(job).load(victim)
    (gate / f"hold-close-{victim}").touch()
    driver.send({"run": 1})
    closing = wait_for(f"closing-{victim}-*", gate)  # the batch is written, the result not returned
    worker = spark_cluster.worker_of(closing.read_text())
    stream = job.stores["counts"].changelog
    changelog = open_changelog_system(job).reader(stream, victim)
    try:
        assert changelog.end_offset() > committed.changelogs["counts"]  # its records are in the changelog
    finally:
        changelog.close()
    assert len(actual_outputs(job, victim)) == committed.outputs["counts-out"] + BATCH  # and its outputs
    worker.kill()
    (gate / f"hold-close-{victim}").unlink()
    moved = driver.answer()
    assert moved.get("batches") == 1, moved
    assert moved["trimmed"] > 0, moved  # the retry neutralised the killed attempt's records

    spark_cluster.start_worker(worker.name)  # back, with the killed attempt's local state on its disk
    assert len(driver.ask({"executors": 2, "timeout": 120})["executors"]) == 2
    rest = driver.ask({"run": 100})
    assert rest.get("lag") == 0 and rest.get("batches") == 2, rest
    assert len({home[0] for home in rest["homes"].values()}) == 2
    check_exact(job_file, tmp_path / "verify")


@pytest.mark.slow  # a zombie attempt fenced on a cluster: test_cluster_kafka.py, in the default run
def test_zombie_on_the_objectstore_changelog_never_becomes_committed_state(tmp_path, spark_cluster, start_driver,
                                                                           seaweed):
    options = seaweed.options(f"zombie-{uuid.uuid4().hex[:10]}", snapshot_every=2)
    section = "[changelogs.objectstore]\n" + "\n".join(f"{k} = {json.dumps(v)}" for k, v in options.items())
    # JSON-lines outputs: the `file` outputs' writer lock would stop the retry while the zombie is
    # frozen (the batch then fails after spark.task.maxFailures; see docs/cluster.md).
    outputs = f'[outputs.counts-out]\nsystem = "jsonl"\npath = "{tmp_path / "job" / "out"}"'
    job_file = write_job(tmp_path / "job", spark_cluster.url, state_dir=tmp_path / "driver" / "state",
                         changelog="objectstore", output=outputs, local_dir="${LOCALSTATE_TEST_HOST_DIR}",
                         extra=section)
    gate = job_file.parent / "gate"
    job = load_job_config(job_file)
    driver = start_driver(job_file, BATCH)
    assert driver.ask({"run": 1}).get("batches") == 1

    victim = 2
    frozen = freeze_host_mid_batch(spark_cluster, driver, gate, victim)

    checkpoints = checkpoint_store(job)
    committed = checkpoints.load(victim)
    system = open_changelog_system(job)
    stream = job.stores["counts"].changelog
    objects_before = {info.key for info in system.objects(stream, victim)}
    # The zombie's Python worker wakes (its executor still frozen): it processes its range, flushes its
    # deltas to the object store and writes its outputs, then stops in close(), its result unreturned.
    # (Under heavy load the woken worker was seen to stall before it got there; then it wrote nothing
    # and only the end of the test applies.)
    (gate / f"hold-close-{victim}").touch()
    frozen.worker.signal(signal.SIGCONT, frozen.python_groups)
    zombie = _wait_for_file(gate, f"closing-{victim}-{frozen.task_pid}", frozen.task_pid, timeout=90)
    written = {info.key for info in system.objects(stream, victim)} - objects_before
    if zombie is not None:
        assert written, "the zombie flushed no delta object"
        # Its outputs land after the committed position (nothing fences JSON-lines appends); the next
        # open of the partition truncates them.
        assert len(actual_outputs(job, victim)) == committed.outputs["counts-out"] + BATCH
    assert checkpoints.load(victim) == committed  # the driver did not take its result
    (gate / f"hold-close-{victim}").unlink()
    if zombie is not None:
        _wait_for_file(gate, f"closed-{victim}-{pid_of(zombie)}", pid_of(zombie), timeout=30)
    frozen.worker.signal(signal.SIGCONT, frozen.jvm_groups)
    _wait_gone(frozen.task_pid)  # its executor learns it was lost and ends; no late appends (see docs)

    rest = driver.ask({"run": 100})
    assert rest.get("lag") == 0, rest
    # No committed checkpoint ever named the zombie's objects (the final one names the deltas and
    # snapshot it is made of), and the state and outputs are exact.
    final = checkpoints.load(victim).manifests["counts"]
    assert _named(final, {info.key for info in system.objects(stream, victim)})
    assert not _named(final, written)
    system.close()
    check_exact(job_file, tmp_path / "verify")


def test_driver_killed_mid_batch_a_new_driver_resumes(tmp_path, spark_cluster, start_driver):
    job_file = _file_job(tmp_path, spark_cluster.url)
    gate = job_file.parent / "gate"
    job = load_job_config(job_file)
    driver = start_driver(job_file, BATCH)
    assert driver.ask({"run": 2}).get("batches") == 2
    committed = {p: checkpoint_store(job).load(p) for p in range(PARTITIONS)}

    victim = 3
    (gate / f"hold-{victim}").touch()
    driver.send({"run": 1})
    reached = wait_for(f"reached-{victim}-*", gate)
    os.killpg(driver.process.pid, signal.SIGKILL)  # the driver and its JVM, mid-batch
    driver.process.wait()
    (gate / f"hold-{victim}").unlink()  # the orphaned task may run on until its executor goes
    _wait_gone(pid_of(reached))
    # Nothing of the interrupted batch was committed.
    assert {p: checkpoint_store(job).load(p) for p in range(PARTITIONS)} == committed

    again = start_driver(job_file, BATCH)  # a new driver (a new Spark application), the same job
    rest = again.ask({"run": 100})
    assert rest.get("lag") == 0 and rest.get("batches") == 2, rest
    # It resumed from the committed checkpoints: exactly the two batches not committed were read.
    assert rest["records_in"] == PARTITIONS * (EVENTS - 2 * BATCH), rest
    check_exact(job_file, tmp_path / "verify")
