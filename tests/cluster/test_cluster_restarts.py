"""Restarts stay warm on a cluster (issue 43, item 5): ``localstate run`` on the two-worker standalone
cluster, the objectstore changelog and the checkpoints on SeaweedFS (S3), each host's stores in its
own stable ``local_dir``, a standing run on a JSON-lines input that the test appends to.

1. a first run commits state on both hosts, then stops cleanly (SIGTERM);
2. a restarted run: its first batch finds at least 90% of its partitions warm (no restore), by its own
   progress figures (``progress.jsonl``: ``state.warm_tasks`` of ``state.stateful_tasks``); then its
   driver is killed (SIGKILL of the ``localstate run`` process, while it waits for input);
3. a new driver: warm again, by the same figures; outputs and state exact at the end.

Each committed checkpoint names the home of the attempt that committed it (``Checkpoint.home``), and
a new driver asks its new executors their homes before its first batch (docs/cluster.md, "Warm
restarts"); without that, each restart placed the partitions by load alone (warm 0 of 4 was seen).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from jobs import PARTITIONS, actual_outputs, restored_state, write_job  # noqa: E402

from localstate.core.config import load_job_config  # noqa: E402
from localstate.runtime.layout import checkpoint_store  # noqa: E402
from localstate.core.partitioner import partition_for  # noqa: E402
from localstate.runtime.driver.progress import PROGRESS_FILE, progress_directory  # noqa: E402
from localstate.runtime.spark.cluster import local_home  # noqa: E402
from localstate.runtime.spark.devcluster import HOST_DIR_VARIABLE  # noqa: E402

pytestmark = [pytest.mark.cluster, pytest.mark.spark]

LINES = 120
"""lines appended to each input partition before each run"""
KEYS = [f"user-{i}" for i in range(400)]
WARM = 0.9
"""the fraction of a restarted run's first-batch partitions that must find their state warm"""


def _append(inputs: Path, round_number: int) -> None:
    """``LINES`` more records in each input partition, keyed so that each sits in its key's partition."""
    for partition in range(PARTITIONS):
        keys = [key for key in KEYS if partition_for(key, PARTITIONS) == partition][:12]
        with open(inputs / f"{partition}.jsonl", "a") as out:
            for i in range(LINES):
                out.write(json.dumps({"key": keys[(round_number * 7 + i) % len(keys)], "value": 1}) + "\n")


def _lines(inputs: Path, partition: int) -> list[str]:
    return [json.loads(line)["key"] for line in (inputs / f"{partition}.jsonl").read_text().splitlines()]


class CliRun:
    """A standing ``localstate run`` on the cluster, in a process group of its own."""

    def __init__(self, job_file: Path, env: dict[str, str], master: str) -> None:
        self.log = job_file.parent / f"run-{uuid.uuid4().hex[:6]}.log"
        command = [sys.executable, "-c", "import sys; from localstate.tools.cli import main; sys.exit(main())",
                   "run", str(job_file), "--master", master]
        with open(self.log, "wb") as log:
            self.process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT,
                                            start_new_session=True)

    def output(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]

    def batches(self, job: Any, inputs: Path, seen: set[str], timeout: float = 300.0) -> list[dict[str, Any]]:
        """The progress objects of this run's batches (run ids not in ``seen``), once the job has
        consumed every line of ``inputs`` (every committed record is in exactly one batch's
        ``rows_in``): the run then waits for more, idle."""
        total = sum(len(_lines(inputs, partition)) for partition in range(PARTITIONS))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.process.poll() is None, f"the run exited ({self.process.returncode}):\n{self.output()}"
            progress = _progress(job)
            if sum(p["rows_in"] for p in progress) == total:
                mine = [p for p in progress if p["run_id"] not in seen]
                seen.update(p["run_id"] for p in mine)
                return mine
            time.sleep(0.2)
        raise AssertionError(f"the job did not consume its input in {timeout:.0f}s:\n{self.output()}")

    def stop(self) -> None:
        """SIGTERM: a clean stop (exit 0)."""
        self.process.send_signal(signal.SIGTERM)
        assert self.process.wait(timeout=120) == 0, self.output()

    def kill(self) -> None:
        """SIGKILL of the driver process alone, as ``kill -9 <pid>``; its Spark JVM exits once the
        Python process is gone (stdin closed), which ends the application and frees the executors."""
        self.process.kill()
        self.process.wait()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                os.killpg(self.process.pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.2)
        os.killpg(self.process.pid, signal.SIGKILL)  # a JVM that outlived its driver: not what is tested
        raise AssertionError("the driver's Spark JVM outlived the killed driver process by 60 s")


def _progress(job: Any) -> list[dict[str, Any]]:
    path = progress_directory(job) / PROGRESS_FILE
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.endswith("}")]


def _warm(first: dict[str, Any]) -> float:
    state = first["state"]
    assert state["stateful_tasks"] == PARTITIONS, first  # every partition had committed state to find
    return state["warm_tasks"] / state["stateful_tasks"]


@pytest.mark.slow  # a cluster driver killed, a new one resuming: test_cluster_recovery.py, in the default run
def test_clean_stop_and_driver_kill_restart_warm(tmp_path, live_cluster, seaweed, monkeypatch):
    options = seaweed.options(f"restarts-{uuid.uuid4().hex[:10]}", snapshot_every=3)
    section = "[changelogs.objectstore]\n" + "\n".join(f"{k} = {json.dumps(v)}" for k, v in options.items())
    inputs = tmp_path / "in"
    inputs.mkdir()
    job_file = write_job(tmp_path / "job", live_cluster.url, state_dir=tmp_path / "driver" / "state",
                         changelog="objectstore", local_dir="${LOCALSTATE_TEST_HOST_DIR}", extra=section,
                         inputs=f'[inputs.events]\nsystem = "jsonl"\npath = "{inputs}"')
    job = load_job_config(job_file)
    env = {**live_cluster.env, "LOCALSTATE_TESTING": "1"}
    seen: set[str] = set()
    warm: dict[str, float] = {}

    _append(inputs, 0)
    run = CliRun(job_file, env, live_cluster.url)
    assert run.batches(job, inputs, seen)[0]["state"]["stateful_tasks"] == 0  # a new job: nothing to find yet
    _append(inputs, 1)  # and a second round, as a standing job gets
    run.batches(job, inputs, seen)
    run.stop()

    _append(inputs, 2)
    run = CliRun(job_file, env, live_cluster.url)
    warm["after a clean stop"] = _warm(run.batches(job, inputs, seen)[0])
    run.kill()

    _append(inputs, 3)
    run = CliRun(job_file, env, live_cluster.url)
    warm["after a driver kill"] = _warm(run.batches(job, inputs, seen)[0])
    run.stop()
    print(f"warm restarts: {warm}")
    assert all(ratio >= WARM for ratio in warm.values()), warm

    # The committed checkpoints (objects in S3) name the homes of the two hosts, each holding partitions
    # (read before the exactness check below, whose restore opens the partitions in this process).
    hosts = {}
    for worker in live_cluster.workers.values():
        monkeypatch.setenv(HOST_DIR_VARIABLE, str(worker.root / "host"))
        hosts[local_home(job)] = worker.name
    checkpoints = checkpoint_store(job)
    named = {hosts.get(checkpoints.load(p).home) for p in range(PARTITIONS)}
    assert named == set(live_cluster.workers), named

    # Exact: every partition's running counts and the committed state, against plain Python.
    expected_state: Counter[str] = Counter()
    for partition in range(PARTITIONS):
        counts: Counter[str] = Counter()
        expected = []
        for key in _lines(inputs, partition):
            counts[key] += 1
            expected.append((key, counts[key]))
        assert actual_outputs(job, partition) == expected, f"partition {partition}"
        expected_state.update(counts)
    assert restored_state(job, tmp_path / "verify") == dict(expected_state)
