"""A standing ``localstate run`` on a Kafka (Tansu) topic: records produced after the start are
processed by the same run; a Python worker killed mid-batch is retried by Spark and progress.jsonl
records the retried attempt with its reason; Ctrl-C (SIGINT to the whole process group, as a terminal
sends it) in the middle of a batch stops it cleanly with exit 0; a SIGKILLed driver resumes; after
each, the restarted job's outputs are exact."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from counting_job import write_counting_job  # tests/ is on sys.path (tests/conftest.py)
from localstate.changelog.kafka.client import CONNECTION_OPTIONS, client_settings
from localstate.changelog.kafka.streams import ensure_topic, produce
from localstate.core.config import load_job_config
from localstate.core.options import validate_options
from localstate.runtime.driver.progress import PROGRESS_FILE, progress_directory
from tests.spark.test_spark_runtime import cli_command
from tests.spark.test_standing_run import (STOP_TIMEOUT, assert_exact, standing, wait_for_counts, wait_for_file)

pytestmark = [pytest.mark.kafka, pytest.mark.spark]



def _job_file(tmp_path: Path, servers: str, topic: str) -> Path:
    return write_counting_job(tmp_path, "standing-kafka", partitions=1, job={"task": "standing_task:SlowOnce"},
                              kafka={"bootstrap_servers": servers, "topic": topic}, store={"backend": "memory"})


def _topic(kafka_broker: Any, topic: str) -> Any:
    """``send(keys, value=0)`` producing to ``topic`` (created, 1 partition)."""
    servers = {"bootstrap_servers": kafka_broker.bootstrap_servers}
    settings = client_settings(validate_options(CONNECTION_OPTIONS, servers, "test"))
    assert ensure_topic(settings, topic, 1, -1, create=True) == 1

    def send(keys: list[str], value: Any = 0) -> None:
        produce(settings, topic, [(key.encode(), json.dumps(value).encode(), 0) for key in keys])

    return send


def _until_drained(job_file: Path) -> None:
    done = subprocess.run(cli_command("run", str(job_file), "--master", "local[2]", "--until-drained"),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]


def test_standing_run_on_kafka_follows_produced_records_and_stops_on_ctrl_c(tmp_path, kafka_broker, topic_prefix):
    topic = topic_prefix + "events"
    send = _topic(kafka_broker, topic)
    keys = [f"u{i % 4}" for i in range(10)]
    send(keys)
    job_file = _job_file(tmp_path, kafka_broker.bootstrap_servers, topic)
    process, lines = standing(job_file, start_new_session=True)  # its own process group, as in a terminal
    try:
        lines.wait_for("batch 0:")
        more = [f"u{i % 3}" for i in range(9)]
        send(more)  # produced after the start: processed by the same run
        keys += more
        wait_for_counts(job_file, Counter(keys))

        # A Python worker killed in the middle of a batch: Spark retries the task by itself.
        killed = tmp_path / "killed.marker"
        send(["u2"], {"marker": str(killed), "sleep": 30})
        keys.append("u2")
        os.kill(int(wait_for_file(killed)), signal.SIGKILL)
        wait_for_counts(job_file, Counter(keys))
        lines.wait_for("(1 failed task attempt(s) retried)", anywhere=True)

        marker = tmp_path / "slow.marker"
        send(["u1"], {"marker": str(marker), "sleep": 3})
        keys.append("u1")
        wait_for_file(marker)
        os.killpg(process.pid, signal.SIGINT)  # Ctrl-C: the driver, its JVM and the Python workers' group leader
        assert process.wait(timeout=STOP_TIMEOUT) == 0
    finally:
        process.kill()
        process.wait()
    stdout, stderr = lines.rest(), process.stderr.read()  # type: ignore[union-attr]
    assert "stopped:" in stdout and "SIGINT: stopping" in stderr, stdout + stderr[-3000:]
    # progress.jsonl records the retried attempt, with its reason.
    progress = [json.loads(line) for line in
                (progress_directory(load_job_config(job_file)) / PROGRESS_FILE).read_text().splitlines()]
    [retried] = [p for p in progress if p["failed_attempts"]]
    assert retried["failed_attempt_reasons"] == [{
        "batch": retried["batch"], "partition": 0, "attempt": 0, "type": "WorkerExited",
        "message": "Python worker exited unexpectedly (attempt 0 of partition 0)",
        "host": retried["failed_attempt_reasons"][0]["host"]}]
    send(["u7", "u7"])
    keys += ["u7", "u7"]
    _until_drained(job_file)
    assert_exact(job_file, keys)


@pytest.mark.slow  # the same kill on a jsonl input: tests/spark/test_standing_run.py, in the default run
def test_standing_run_on_kafka_driver_sigkill_mid_batch_then_restart_is_exact(tmp_path, kafka_broker, topic_prefix):
    topic = topic_prefix + "killed-driver"
    send = _topic(kafka_broker, topic)
    keys = [f"u{i % 4}" for i in range(12)]
    send(keys)
    job_file = _job_file(tmp_path, kafka_broker.bootstrap_servers, topic)
    process, lines = standing(job_file, start_new_session=True)
    try:
        lines.wait_for("batch 0:")
        marker = tmp_path / "slow.marker"
        send(["u1", "u2"], {"marker": str(marker), "sleep": 30})
        keys += ["u1", "u2"]
        wait_for_file(marker)
        os.kill(process.pid, signal.SIGKILL)  # the driver only, in the middle of the batch
        process.wait(timeout=STOP_TIMEOUT)
    finally:
        process.kill()
        process.wait()
    send(["u3"] * 2)
    keys += ["u3"] * 2
    _until_drained(job_file)  # the killed driver's JVM and workers die with it; the restart resumes
    assert_exact(job_file, keys)
