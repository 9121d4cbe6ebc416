"""Signals as a service manager and a terminal send them (issue #43, item 4), to real standing
``localstate run`` processes on local Spark, each during a batch, during a commit and while idle:

* SIGTERM (to the driver, as systemd's ``KillMode=mixed`` and ``kill`` send it), SIGINT (Ctrl-C, to
  the process group) and SIGHUP (a terminal hang-up: to the process group, and once through a real
  pseudo-terminal that closes) stop cleanly: the batch in flight is committed (or, past the grace
  period, abandoned, as the run reports), exit 0, ``live.json`` says stopped;
* the same signal twice stops now: the batch in flight is abandoned, exit 128 + the signal;
* SIGQUIT (Ctrl-\\) prints the Python threads' stacks and exits at once (131): what was not committed
  is rolled back by the next start.

"During a commit" is a run paused (SIGSTOP, by the test-only crash point ``driver_commit:2:stop``)
after its tasks prepared the batch's commit and before the driver saved its checkpoints; the signal
reaches it there when it continues. After each step the committed positions are what the run says
it committed; each next step's run is the restart that rolls back what the previous one left, and a
last bounded run finishes the input: every count emitted exactly once, nothing lost.

The three chains (one per moment) run side by side, each a job of its own: 13 runs in all with
``-m slow``; the default run takes a subset that still sends every signal kind and the double signal
(7 runs, :data:`DEFAULT_CHAINS`)."""

from __future__ import annotations

import fcntl
import os
import pty
import select
import signal
import subprocess
import termios
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from localstate.core.checkpoint import CheckpointStore
from localstate.core.config import load_job_config
from localstate.runtime.layout import job_directory
from localstate.runtime.driver.operating import NOT_LIVE
from localstate.runtime.driver.progress import LIVE_FILE, progress_directory, read_live
from localstate.runtime.spark.runner import SparkJobRunner
from localstate.tools.status import job_status

from .test_spark_runtime import cli_command
from .test_standing_run import PARTITIONS, START_TIMEOUT, Lines, append, assert_exact, counting_job, wait_for_file

pytestmark = pytest.mark.spark

STOP_TIMEOUT = 120.0  # generous bound on a stop (never asserted as a timing): grace 10 s + Spark's shutdown


@dataclass
class Step:
    sig: signal.Signals
    moment: str                # "batch", "commit" or "idle"
    group: bool = False        # to the process group (a terminal), else to the driver only
    twice: bool = False
    terminal: bool = False     # a real pseudo-terminal that hangs up (SIGHUP)
    damaged_files: bool = False  # start with progress/ a regular file (the run must not mind)


CHAINS = {
    "batch": [Step(signal.SIGTERM, "batch"), Step(signal.SIGINT, "batch", group=True),
              Step(signal.SIGHUP, "batch", group=True), Step(signal.SIGQUIT, "batch", group=True),
              Step(signal.SIGTERM, "batch", twice=True)],
    "commit": [Step(signal.SIGINT, "commit", group=True), Step(signal.SIGTERM, "commit"),
               Step(signal.SIGHUP, "commit", group=True), Step(signal.SIGQUIT, "commit")],
    "idle": [Step(signal.SIGTERM, "idle", damaged_files=True), Step(signal.SIGINT, "idle", group=True),
             Step(signal.SIGHUP, "idle", terminal=True), Step(signal.SIGQUIT, "idle", group=True)],
}

# Each signal kind, a second signal, a real terminal's hang-up and damaged operating files, at one
# moment or another: the default run's chains (the full ones above are the slow soak).
DEFAULT_CHAINS = {
    "batch": [Step(signal.SIGTERM, "batch"), Step(signal.SIGHUP, "batch", group=True),
              Step(signal.SIGTERM, "batch", twice=True)],
    "commit": [Step(signal.SIGINT, "commit", group=True), Step(signal.SIGQUIT, "commit")],
    "idle": [Step(signal.SIGTERM, "idle", damaged_files=True), Step(signal.SIGHUP, "idle", terminal=True)],
}


def committed(job_file: Path) -> int:
    """Input records committed, over every partition."""
    job = load_job_config(job_file)
    store = CheckpointStore(job.state_dir / job.name / "checkpoints", anchor=job.state_dir)
    return sum((checkpoint.inputs.get("events", 0) if (checkpoint := store.load(p)) is not None else 0)
               for p in range(PARTITIONS))


def stopped_process(pid: int, timeout: float = START_TIMEOUT) -> None:
    """Wait until ``pid`` is stopped (SIGSTOP at its crash point)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with open(f"/proc/{pid}/stat") as handle:
            if handle.read().rpartition(")")[2].split()[0] == "T":
                return
        time.sleep(0.05)
    raise AssertionError(f"process {pid} never stopped at its crash point")


class Run:
    """One standing `localstate run` of a chain's job, driven through one step."""

    def __init__(self, job_file: Path, step: Step, index: int) -> None:
        self.job_file, self.step = job_file, step
        self.tmp = job_file.parent
        env = {**os.environ, "LOCALSTATE_TESTING": "1"}
        if step.moment == "commit":
            env["LOCALSTATE_CRASH_AT"] = "driver_commit:2:stop"
        command = cli_command("run", str(job_file), "--master", "local[2]")
        self.master: int | None = None
        if step.terminal:
            self.master, slave = pty.openpty()
            self.process = subprocess.Popen(command, stdin=slave, stdout=slave, stderr=subprocess.PIPE, text=True,
                                            env=env, start_new_session=True,
                                            preexec_fn=lambda: fcntl.ioctl(0, termios.TIOCSCTTY, 0))
            os.close(slave)
            self.lines = None  # read by drive() itself: a thread blocked reading the master would keep it open
        else:
            self.process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                            env=env, start_new_session=True)
            self.lines = Lines(self.process)
        self.errors = Lines(_Stderr(self.process))
        self.index = index
        self.in_flight = 0

    def send(self, sig: int) -> None:
        if self.step.group:
            os.killpg(self.process.pid, sig)
        else:
            self.process.send_signal(sig)

    def drive(self, keys: list[str]) -> None:
        """Reach the step's moment, signal, wait for the exit."""
        step = self.step
        if step.terminal:
            _pty_wait_for(self.master, "batch 0:")
        else:
            self.lines.wait_for("batch 0:", anywhere=True)  # the input pending at the start: committed
        # One record in flight: one append, so that no plan can see part of it.
        if step.moment == "batch":
            marker = self.tmp / f"slow-{self.index}.marker"
            self.in_flight = 1
            sleep = 3 if not step.twice and step.sig != signal.SIGQUIT else 60  # a clean stop lets it complete
            append(self.tmp / "data", ["user-2"], {"marker": str(marker), "sleep": sleep})
            keys.append("user-2")
            wait_for_file(marker)
        elif step.moment == "commit":
            self.in_flight = 1
            append(self.tmp / "data", ["user-4"])
            keys.append("user-4")
            stopped_process(self.process.pid)
        if step.terminal:
            os.close(self.master)  # the terminal hangs up: SIGHUP to its foreground process group
        else:
            self.send(step.sig)
        if step.twice:
            self.errors.wait_for(f"{step.sig.name}: stopping", anywhere=True)
            self.send(step.sig)
        if step.moment == "commit":
            (os.killpg if step.group else os.kill)(self.process.pid, signal.SIGCONT)
        self.process.wait(timeout=STOP_TIMEOUT)

    def check(self, before: int) -> int:
        """The exit code, messages and committed positions of the step (``before``: records committed
        before the step's own, in flight at its signal); returns what is committed now."""
        step, code = self.step, self.process.returncode
        stdout, stderr = ("" if step.terminal else self.lines.rest()), self.errors.rest()
        name = step.sig.name
        now = committed(self.job_file)
        live = read_live(load_job_config(self.job_file)).value or {}
        if step.sig == signal.SIGQUIT:
            assert code == 128 + signal.SIGQUIT, (code, stderr[-3000:])
            assert "SIGQUIT: exiting at once" in stderr
            assert "Current thread 0x" in stderr and "(most recent call first)" in stderr, stderr[-3000:]
            assert now == before, "a SIGQUIT run committed its batch in flight"
            assert live.get("state") == "running"  # it did not stop cleanly: status says its pid is gone
            status = job_status(load_job_config(self.job_file))
            assert status["liveness"] == NOT_LIVE and "is gone" in status["why"], status["why"]
            return now
        if step.twice:
            assert code == 128 + step.sig, (code, stderr[-3000:])
            assert f"{name} again: stopping now" in stderr
            assert "stopped now:" in stdout and "abandoned, not committed" in stdout, stdout
            assert now == before, "a forced stop committed the batch in flight"
        else:
            assert code == 0, (code, stderr[-3000:])
            assert f"{name}: stopping" in stderr
            abandoned = "abandoned, not committed" in stdout
            if not step.terminal:
                assert "stopped:" in stdout, stdout
            assert now == before + (0 if abandoned else self.in_flight), (now, before, stdout)
        if step.damaged_files:
            assert "cannot write the heartbeat" in stderr and "not a directory" in stderr, stderr[-3000:]
        else:
            assert live.get("state") == "stopped", live
        assert "localstate/" not in stderr.partition("Traceback")[2], stderr[-3000:]  # PySpark's own notes only
        return now


class _Stderr:
    """A stand-in process for :class:`Lines` reading stderr."""

    def __init__(self, process: subprocess.Popen) -> None:
        self.stdout = process.stderr


def _pty_wait_for(master: int, text: str, timeout: float = START_TIMEOUT) -> None:
    """Read a pseudo-terminal's master side until ``text`` has been written to it."""
    seen = b""
    deadline = time.monotonic() + timeout
    while text.encode() not in seen:
        if time.monotonic() > deadline:
            raise AssertionError(f"{text!r} never written to the terminal:\n{seen.decode(errors='replace')}")
        ready, _, _ = select.select([master], [], [], 0.2)
        if ready:
            seen += os.read(master, 65536)


def run_chain(tmp_path: Path, moment: str, steps: list[Step], outcome: dict[str, Any]) -> None:
    """The steps of one chain, one standing run each, on one job; ``outcome[moment]``: the job file
    and every key appended (or the exception that failed the chain)."""
    try:
        job_file = counting_job(tmp_path / moment, f"signals-{moment}")
        data = tmp_path / moment / "data"
        keys = [f"user-{i % 5}" for i in range(12)]
        append(data, keys)
        for index, step in enumerate(steps):
            directory = progress_directory(load_job_config(job_file))
            if step.damaged_files:
                job_directory(load_job_config(job_file))  # the job's directory, as localstate makes it
                directory.write_text("not a folder")
            append(data, [f"user-{index}"])  # pending at the start: the run's batch 0 commits it (and what the
            keys.append(f"user-{index}")     # step before left uncommitted)
            before = len(keys)
            run = Run(job_file, step, index)
            try:
                run.drive(keys)
            finally:
                if run.process.poll() is None:
                    run.process.kill()
                    run.process.wait()
            run.check(before)
            if step.damaged_files:
                directory.unlink()  # the run ran without its operating files: give them back
        outcome[moment] = (job_file, keys)
    except BaseException as exc:  # noqa: BLE001 - raised again by the test's main thread
        outcome[f"{moment} failed"] = exc


@pytest.mark.parametrize("chains", [DEFAULT_CHAINS, pytest.param(CHAINS, marks=pytest.mark.slow)],
                         ids=["default", "every-step"])
def test_signals_during_a_batch_a_commit_and_idle(tmp_path, spark_context, chains):
    outcome: dict[str, Any] = {}
    threads = [threading.Thread(target=run_chain, args=(tmp_path, moment, steps, outcome), daemon=True)
               for moment, steps in chains.items()]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for moment in chains:
        if f"{moment} failed" in outcome:
            raise outcome[f"{moment} failed"]
    # A chain's last run may have left a batch uncommitted (SIGQUIT, a second signal): a bounded run
    # rolls back and finishes.
    for moment in chains:
        job_file, keys = outcome[moment]
        SparkJobRunner(load_job_config(job_file), context=spark_context, progress=None).run()
        assert committed(job_file) == len(keys)
        assert_exact(job_file, keys)
        assert (progress_directory(load_job_config(job_file)) / LIVE_FILE).exists()
