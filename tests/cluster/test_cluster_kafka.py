"""The counting job on the two-worker standalone cluster with the Kafka changelog (Tansu):

- no shared file system at all: the driver keeps the checkpoints in its own directory, the
  executors keep the stores in their Spark local directories, inputs come from the generator and
  outputs go to a Kafka topic; nothing of the job is written where the other host could see it;
- a zombie: a whole host is paused (SIGSTOP) in the middle of a task, the driver declares its
  executor lost and the partition commits on the other worker; the paused task then resumes and
  runs on, and none of its writes reaches the changelog or the outputs (the Kafka changelog's
  transactional fencing); the job goes on, exact. (File outputs and the file changelog would not
  do here: their writers hold a lock on the shared directory, which the paused host keeps.)
"""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from jobs import PARTITIONS, actual_outputs, expected_outputs, expected_state, freeze_host_mid_batch, \
    restored_state, wait_for_or_exit, write_job  # noqa: E402

from localstate.core.config import load_job_config  # noqa: E402
from localstate.runtime.layout import open_changelog_system

pytestmark = [pytest.mark.cluster, pytest.mark.spark, pytest.mark.kafka]

BATCH = 300
CHANGELOG = "cluster-counts-counts-changelog"


def _kafka_section(broker, prefix: str) -> str:
    return f'[changelogs.kafka]\nbootstrap_servers = "{broker.bootstrap_servers}"\ntopic_prefix = "{prefix}"\n' \
           f'transactional_id_prefix = "{prefix}"'


def _kafka_output(broker, prefix: str) -> str:
    return (f'[outputs.counts-out]\nsystem = "kafka"\ntopic = "{prefix}counts-out"\n'
            f'bootstrap_servers = "{broker.bootstrap_servers}"')


def test_kafka_changelog_without_any_shared_file_system(tmp_path, spark_cluster, start_driver, kafka_broker):
    prefix = f"nfs-free-{time.time_ns()}-"
    driver_dir = tmp_path / "driver-only"  # the driver's own disk: checkpoints
    output = _kafka_output(kafka_broker, prefix)
    job_file = write_job(tmp_path / "job", spark_cluster.url, state_dir=driver_dir, changelog="kafka",
                         output=output, extra=_kafka_section(kafka_broker, prefix))
    driver = start_driver(job_file, BATCH)
    summary = driver.ask({"run": 100})
    assert summary.get("lag") == 0, summary
    assert summary["warm_fraction"] >= 0.9, summary
    job = load_job_config(job_file)
    for partition in range(PARTITIONS):
        assert actual_outputs(job, partition) == expected_outputs(partition), f"partition {partition}"
    assert restored_state(job, tmp_path / "verify") == expected_state()
    # The driver's directory holds the checkpoints only: no executor wrote a store there.
    assert sorted(p.name for p in (driver_dir / "cluster-counts").iterdir() if not p.name.startswith(".")) == \
        ["checkpoints"]
    # Each host's stores are in its own Spark local directory.
    for worker in spark_cluster.workers.values():
        assert list((worker.root / "local").glob("spark-*/executor-*/blockmgr-*/localstate/cluster-counts/stores/"
                                                 "counts/*")), worker.name


def test_zombie_attempt_cannot_make_its_writes_visible(tmp_path, spark_cluster, start_driver, kafka_broker):
    prefix = f"zombie-{time.time_ns()}-"
    job_file = write_job(tmp_path / "job", spark_cluster.url, state_dir=tmp_path / "shared" / "state",
                         changelog="kafka", local_dir="${LOCALSTATE_TEST_HOST_DIR}",
                         output=_kafka_output(kafka_broker, prefix), extra=_kafka_section(kafka_broker, prefix))
    gate = job_file.parent / "gate"
    job = load_job_config(job_file)
    driver = start_driver(job_file, BATCH)
    assert driver.ask({"run": 2}).get("batches") == 2

    victim = 2
    frozen = freeze_host_mid_batch(spark_cluster, driver, gate, victim)

    changelog = open_changelog_system(job).reader(CHANGELOG, victim)
    committed_end = changelog.end_offset()
    committed_outputs = len(actual_outputs(job, victim))
    # The zombie's Python worker wakes first (its executor still frozen, so nobody tells it to
    # stop): it leaves the gate, processes the rest of its range and tries to commit: it flushes the
    # changelog and the outputs, which the broker refuses (fenced producer). The commit attempt over
    # (refused or not), the runtime closes the task, which stops at the close gate: the checks run
    # once the zombie has tried every write it would make, or once it is gone (and writes nothing).
    (gate / f"hold-close-{victim}").touch()
    frozen.worker.signal(signal.SIGCONT, frozen.python_groups)
    wait_for_or_exit(f"closing-{victim}-{frozen.task_pid}", gate, frozen.task_pid, timeout=180)
    assert changelog.end_offset() == committed_end
    assert len(actual_outputs(job, victim)) == committed_outputs
    changelog.close()
    (gate / f"hold-close-{victim}").unlink()
    frozen.worker.signal(signal.SIGCONT, frozen.jvm_groups)

    rest = driver.ask({"run": 100})
    assert rest.get("lag") == 0, rest
    for partition in range(PARTITIONS):
        assert actual_outputs(job, partition) == expected_outputs(partition), f"partition {partition}"
    assert restored_state(job, tmp_path / "verify") == expected_state()
