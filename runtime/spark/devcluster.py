"""A Spark standalone cluster on loopback for tests and benchmarks (development only): a master and
workers started from the pip pyspark distribution's ``spark-class``, each worker with its own work,
local and "host" directories, standing in for separate hosts.

Each worker runs in a process group of its own; its Python daemon (which makes a process group of its
own) is found by its ``SPARK_LOCAL_DIRS`` (Linux ``/proc``), so a caller can kill or pause a whole
"host": its worker and executor JVMs and its Python workers::

    cluster = StandaloneCluster(tmp_dir).start()        # master + workers w0, w1 (1 core, 1g each)
    cluster.url                                          # spark://127.0.0.1:<port>
    cluster.workers["w1"].kill(); cluster.start_worker("w1")
    cluster.stop()
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pyspark

__all__ = ["StandaloneCluster", "Worker", "free_port", "wait_for_port", "HOST_DIR_VARIABLE"]

HOST_DIR_VARIABLE = "LOCALSTATE_TEST_HOST_DIR"
"""Exported to each worker (and so to its executors and Python workers): a stable per-host directory,
for ``[job] local_dir = "${LOCALSTATE_TEST_HOST_DIR}"``."""


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
        self.env = {**env, "SPARK_LOCAL_DIRS": str(root / "local"), HOST_DIR_VARIABLE: str(root / "host")}
        self.command = [str(spark_class), "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1",
                        "--cores", "1", "--memory", "1g", "--work-dir", str(root / "work"),
                        "--webui-port", str(free_port()), master_url]
        self.process: subprocess.Popen | None = None

    def start(self) -> "Worker":
        with open(self.root / "worker.log", "ab") as log:
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


class StandaloneCluster:
    """A standalone master and its workers (``w0``, ``w1``...), all on 127.0.0.1."""

    def __init__(self, root: Path) -> None:
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

    def start(self, workers: int = 2) -> "StandaloneCluster":
        self.root.mkdir(parents=True, exist_ok=True)
        with open(self.root / "master.log", "ab") as log:
            self.master = subprocess.Popen(
                [str(self.spark_class), "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port",
                 str(self.port), "--webui-port", str(free_port())], env=self.env, stdout=log, stderr=log,
                start_new_session=True)
        wait_for_port(self.port, 90)
        for name in (f"w{i}" for i in range(workers)):
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
