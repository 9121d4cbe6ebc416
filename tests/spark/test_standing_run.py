"""Standing runs (issue #33): ``localstate run JOB`` waits for new input instead of ending when its
inputs are drained, stops cleanly on SIGTERM/SIGINT, and reports why failed task attempts failed.

The CLI runs as a subprocess, so its signals are real: records appended after the start are processed;
a Python worker killed mid-batch is retried and its attempt reported at WARNING and, with its
reason, in progress.jsonl; SIGTERM in the middle of
a batch lets it complete and exits 0; a SIGKILLed driver resumes; after each, a bounded run
(``--until-drained``) finishes the input and the outputs are exact against plain Python. In process: an
idle standing run starts no Spark job, gives its kept instances back after a while, and ``stop()`` ends
it; a killed worker's attempt is in ``BatchResult.failed_attempt_reasons``."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import threading
import time
from collections import Counter, defaultdict
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterable, Iterator

import pytest

from counting_job import write_counting_job
from localstate.core.config import load_job_config
from localstate.core.partitioner import partition_for
from localstate.core.stream import open_output
from localstate.runtime.driver.progress import PROGRESS_FILE, progress_directory
from localstate.runtime.spark import driver as spark_driver
from localstate.runtime.spark.failures import failed_attempt_reasons, record_failed_attempt
from localstate.runtime.spark.runner import SparkJobRunner
from localstate.streams.jsonl import write_jsonl

from .test_spark_runtime import cli_command

pytestmark = pytest.mark.spark

PARTITIONS = 2
#: generous bounds on waits (never asserted as timings): a loaded two-core machine starts Spark slowly
START_TIMEOUT = 180.0
STOP_TIMEOUT = 60.0  # documented bound: the running batch's grace (10 s) + release and Spark stop


class Lines:
    """A subprocess's stdout lines, read in a thread (waits never block on a silent process)."""

    def __init__(self, process: subprocess.Popen) -> None:
        self.seen: list[str] = []
        self._queue: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, args=(process,), daemon=True).start()

    def _read(self, process: subprocess.Popen) -> None:
        for line in process.stdout:  # type: ignore[union-attr]
            self._queue.put(line)
        self._queue.put(None)

    def wait_for(self, prefix: str, timeout: float = START_TIMEOUT, *, anywhere: bool = False) -> str:
        """The first line starting with (``anywhere``: holding) ``prefix``, waiting for it."""
        def match(line: str) -> bool:
            return prefix in line if anywhere else line.startswith(prefix)

        deadline = time.monotonic() + timeout
        for line in self.seen:
            if match(line):
                return line
        while time.monotonic() < deadline:
            try:
                line = self._queue.get(timeout=0.2)
            except queue.Empty:
                continue
            if line is None:
                break
            self.seen.append(line)
            if match(line):
                return line
        raise AssertionError(f"no line starting with {prefix!r}:\n" + "".join(self.seen))

    def rest(self) -> str:
        while True:
            try:
                line = self._queue.get(timeout=5)
            except queue.Empty:
                break
            if line is None:
                break
            self.seen.append(line)
        return "".join(self.seen)


def append(data: Path, keys: Iterable[str], value: Any = 0) -> None:
    """Append one record per key to its partition's ``data/<p>.jsonl``."""
    by_partition: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for key in keys:
        by_partition[partition_for(key, PARTITIONS)].append({"key": key, "value": value, "ts": 1_700_000_000.0})
    for partition, records in by_partition.items():
        write_jsonl(data, partition, records)


def wait_for_file(path: Path, timeout: float = START_TIMEOUT) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists():
            return path.read_text()
        time.sleep(0.05)
    raise AssertionError(f"{path} never appeared")


def wait_for_counts(job_file: Path, expected: Counter, timeout: float = START_TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if last_counts(job_file) == expected:
            return
        time.sleep(0.2)
    raise AssertionError(f"counts never reached {dict(expected)}: {last_counts(job_file)}")


def emitted(job_file: Path) -> dict[str, list[int]]:
    """Every count the job emitted, per key, in order (one key lives in one partition)."""
    job = load_job_config(job_file)
    output = open_output(job, "counts-out")
    try:
        out: dict[str, list[int]] = defaultdict(list)
        for partition in range(job.partitions):
            for key, count in output.read(partition):
                out[key].append(count)
        return dict(out)
    finally:
        output.close()


def last_counts(job_file: Path) -> Counter:
    return Counter({key: counts[-1] for key, counts in emitted(job_file).items()})


def assert_exact(job_file: Path, keys: list[str]) -> None:
    """Each key's emitted counts are exactly 1, 2, ..., its number of input records: nothing lost,
    nothing counted twice (a re-applied batch would repeat counts, a lost one skip them)."""
    expected = Counter(keys)
    assert emitted(job_file) == {key: list(range(1, n + 1)) for key, n in expected.items()}


def standing(job_file: Path, *flags: str, **popen: Any) -> tuple[subprocess.Popen, Lines]:
    process = subprocess.Popen(cli_command("run", str(job_file), "--master", "local[2]", *flags),
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen)
    return process, Lines(process)


@contextmanager
def killed_on_exit(process: subprocess.Popen) -> Iterator[subprocess.Popen]:
    """Kill ``process`` and reap it when the block is left, however it is left."""
    try:
        yield process
    finally:
        process.kill()
        process.wait()


def kill_a_worker_mid_record(data: Path, keys: list[str], marker: Path) -> None:
    """Append a record of user-1 whose Python worker sleeps in it; SIGKILL that worker there."""
    append(data, ["user-1"], {"marker": str(marker), "sleep": 30})
    keys.append("user-1")
    os.kill(int(wait_for_file(marker)), signal.SIGKILL)


def sigterm_mid_record(process: subprocess.Popen, data: Path, keys: list[str], marker: Path, sleep: float) -> None:
    """Append records of user-2 and user-3 (one sleeps ``sleep`` s); SIGTERM the run in it; it exits 0."""
    append(data, ["user-2", "user-3"], {"marker": str(marker), "sleep": sleep})
    keys += ["user-2", "user-3"]
    wait_for_file(marker)
    process.send_signal(signal.SIGTERM)
    code = process.wait(timeout=STOP_TIMEOUT)
    assert code == 0, process.stderr.read()[-8000:] if process.stderr else code  # type: ignore[union-attr]


def kill_the_driver_mid_record(process: subprocess.Popen, data: Path, keys: list[str], marker: Path,
                               sleep: float) -> None:
    """Append records of user-1 and user-2 (one sleeps ``sleep`` s); SIGKILL the driver while a task is in it."""
    append(data, ["user-1", "user-2"], {"marker": str(marker), "sleep": sleep})
    keys += ["user-1", "user-2"]
    wait_for_file(marker)
    os.kill(process.pid, signal.SIGKILL)
    process.wait(timeout=STOP_TIMEOUT)


def stopped_output(process: subprocess.Popen, lines: Lines) -> tuple[str, str]:
    """A stopped run's stdout and stderr; its stdout says ``stopped:`` and its killed worker's attempt is
    reported at WARNING, naming the partition."""
    stdout = lines.rest()
    stderr = process.stderr.read()  # type: ignore[union-attr]
    assert "stopped:" in stdout, stdout + stderr[-3000:]
    warning = next(line for line in stderr.splitlines() if "task attempt 0 of partition" in line)
    assert "WARNING" in warning and "Python worker exited unexpectedly" in warning, stderr[-3000:]
    return stdout, stderr


def finish(job_file: Path) -> subprocess.CompletedProcess:
    done = subprocess.run(cli_command("run", str(job_file), "--master", "local[2]", "--until-drained"),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert "done:" in done.stdout and "lag 0" in done.stdout
    return done


def counting_job(tmp_path: Path, name: str) -> Path:
    return write_counting_job(tmp_path, name, job={"task": "standing_task:SlowOnce"}, store={"backend": "memory"})


def test_standing_jsonl_follows_appends_survives_a_killed_worker_and_stops_on_sigterm(tmp_path):
    job_file = counting_job(tmp_path, "standing-jsonl")
    data = tmp_path / "data"
    keys = [f"user-{i % 7}" for i in range(40)]
    append(data, keys)
    process, lines = standing(job_file)
    with killed_on_exit(process):
        lines.wait_for("standing:")
        lines.wait_for("batch 0:")
        # Appended after the start: processed by the same run.
        more = [f"user-{i % 5}" for i in range(30)]
        append(data, more)
        keys += more
        wait_for_counts(job_file, Counter(keys))

        # A Python worker killed in the middle of a batch: Spark retries the task by itself.
        kill_a_worker_mid_record(data, keys, tmp_path / "killed.marker")
        wait_for_counts(job_file, Counter(keys))
        lines.wait_for("(1 failed task attempt(s) retried)", anywhere=True)

        # SIGTERM while a batch runs: it completes and is committed, the run exits 0.
        sigterm_mid_record(process, data, keys, tmp_path / "slow.marker", sleep=3)
    # The killed worker's attempt is reported at WARNING, with partition, batch and the reason.
    stdout, stderr = stopped_output(process, lines)
    assert "SIGTERM: stopping" in stderr
    # No Java stack; no Python traceback but PySpark's own note when Spark stops (an idle worker's
    # socket closed under it: "PySpark daemon failed to flush the output to the worker process").
    assert "\tat org.apache" not in stderr and "localstate/" not in stderr.partition("Traceback")[2], stderr
    # ...and progress.jsonl records the retried attempt with its reason, a JSON object.
    progress = [json.loads(line) for line in
                (progress_directory(load_job_config(job_file)) / PROGRESS_FILE).read_text().splitlines()]
    retried = [p for p in progress if p["failed_attempts"]]
    assert len(retried) == 1 and retried[0]["failed_attempts"] == 1, [p["failed_attempts"] for p in progress]
    [reason] = retried[0]["failed_attempt_reasons"]
    assert reason["type"] == "WorkerExited" and reason["batch"] == retried[0]["batch"] and reason["attempt"] == 0
    assert reason["message"] == f"Python worker exited unexpectedly (attempt 0 of partition {reason['partition']})"
    assert reason["partition"] == partition_for("user-1", PARTITIONS)

    # The stopped batch was committed (or nothing of it was): a bounded run finishes the input; exact.
    append(data, ["user-9"] * 3)
    keys += ["user-9"] * 3
    finish(job_file)
    assert_exact(job_file, keys)


@pytest.mark.slow  # a driver SIGKILLed mid-batch, then rerun: tests/spark/test_driver_kill.py, in the default run
def test_standing_driver_sigkill_mid_batch_then_restart_is_exact(tmp_path):
    job_file = counting_job(tmp_path, "standing-kill")
    data = tmp_path / "data"
    keys = [f"user-{i % 4}" for i in range(20)]
    append(data, keys)
    process, lines = standing(job_file)
    with killed_on_exit(process):
        lines.wait_for("batch 0:")
        kill_the_driver_mid_record(process, data, keys, tmp_path / "slow.marker", sleep=30)  # mid-batch
    append(data, ["user-3"] * 2)
    keys += ["user-3"] * 2
    finish(job_file)  # the killed driver's workers die with it (the restart waits for their locks)
    assert_exact(job_file, keys)


def test_idle_standing_run_starts_no_spark_job_and_stops(tmp_path, spark_context, monkeypatch):
    monkeypatch.setattr(spark_driver, "IDLE_GIVE_BACK", 5.0)
    job_file = write_counting_job(tmp_path, "standing-idle", store={"backend": "memory"})
    data = tmp_path / "data"
    keys = [f"k{i % 3}" for i in range(12)]
    append(data, keys)
    job = load_job_config(job_file)
    lines: list[str] = []
    runner = SparkJobRunner(job, context=spark_context, progress=lines.append)
    summaries: list[Any] = []
    thread = threading.Thread(target=lambda: summaries.append(runner.run(until_drained=False)), daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while not lines and time.monotonic() < deadline:
            time.sleep(0.05)
        assert lines and lines[0].startswith("batch 0:")
        # Idle through the busy polls (BUSY_FOR), the give-back of the kept instances (IDLE_GIVE_BACK) and
        # 50 slow polls (IDLE_POLL): nothing new, so no Spark job.
        time.sleep(spark_driver.BUSY_FOR + spark_driver.IDLE_GIVE_BACK + 50 * spark_driver.IDLE_POLL)
        tracker = spark_context.statusTracker()
        groups = [len(tracker.getJobIdsForGroup(f"localstate-{runner.run_id}-{batch}")) for batch in range(5)]
        assert groups[0] >= 1 and groups[1:] == [0, 0, 0, 0], groups
        assert len(lines) == 1
        more = ["k0", "k1", "k5"]
        append(data, more)
        keys += more
        while len(lines) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert lines[1].startswith("batch 1:") and "in 3 " in lines[1], lines
    finally:
        runner.stop()
        thread.join(timeout=STOP_TIMEOUT)
    assert not thread.is_alive()
    [summary] = summaries
    assert summary.stopped and summary.batch_count == 2 and summary.abandoned is None
    assert summary.batches[1].reused == 0  # the idle run gave its kept instances back
    assert_exact(job_file, keys)


def test_killed_worker_attempt_is_in_batch_result(tmp_path, spark_context, caplog):
    job_file = write_counting_job(tmp_path, "standing-reasons", store={"backend": "memory"})
    keys = [f"k{i % 5}" for i in range(200)]
    append(tmp_path / "data", keys)
    job = load_job_config(job_file)
    fault = {"partition": 0, "batch": 0, "after": 10, "marker": str(tmp_path / "fault.marker")}
    with caplog.at_level("WARNING", logger="localstate"):
        summary = SparkJobRunner(job, context=spark_context, fault=fault, progress=None).run()
    [result] = summary.batches
    assert result.failed_attempts == 1
    [reason] = result.failed_attempt_reasons
    assert (reason["batch"], reason["partition"], reason["attempt"], reason["type"]) == (0, 0, 0, "WorkerExited")
    assert "Python worker exited unexpectedly (attempt 0 of partition 0)" in reason["message"]
    assert any("task attempt 0 of partition 0 failed" in r.getMessage() for r in caplog.records
               if r.levelname == "WARNING")
    assert not (job.state_dir / job.name / "checkpoints" / "attempts").exists() or \
        not any((job.state_dir / job.name / "checkpoints" / "attempts").rglob("*.json"))
    assert_exact(job_file, keys)


def test_failed_attempt_reasons_are_read_once_and_fill_in_silent_deaths(tmp_path):
    folder = tmp_path / "attempts" / "run"
    record_failed_attempt(str(folder), 4, 1, 0, OSError(28, "No space left on device"))
    record_failed_attempt("", 4, 1, 1, OSError(28, "not recorded"))  # no folder: nothing written
    results = [{"partition": 1, "attempt": 2}, {"partition": 0, "attempt": 0}, {"partition": None, "attempt": 1}]
    reasons = failed_attempt_reasons(folder, 4, results)
    assert [(r["partition"], r["attempt"], r["type"]) for r in reasons] == [(1, 0, "OSError"), (1, 1, "WorkerExited")]
    assert "No space left on device" in reasons[0]["message"] and reasons[0]["host"]
    assert reasons[1]["message"] == "Python worker exited unexpectedly (attempt 1 of partition 1)"
    assert not list(folder.iterdir())  # read once: deleted
    assert failed_attempt_reasons(folder, 4) == []


def test_stop_abandons_a_batch_that_outlives_the_grace(tmp_path, spark_context):
    job_file = write_counting_job(tmp_path, "standing-abandon", job={"task": "standing_task:SlowOnce"},
                                  store={"backend": "memory"})
    data = tmp_path / "data"
    keys = ["a", "b", "c"]
    append(data, keys)
    job = load_job_config(job_file)
    lines: list[str] = []
    runner = SparkJobRunner(job, context=spark_context, progress=lines.append)
    runner.stop_control.grace = 1.0
    summaries: list[Any] = []
    thread = threading.Thread(target=lambda: summaries.append(runner.run(until_drained=False)), daemon=True)
    thread.start()
    try:
        marker = tmp_path / "slow.marker"
        deadline = time.monotonic() + START_TIMEOUT
        while not lines and time.monotonic() < deadline:
            time.sleep(0.05)
        append(data, ["a", "d"], {"marker": str(marker), "sleep": 60})
        keys += ["a", "d"]
        wait_for_file(marker)
    finally:
        runner.stop()
        thread.join(timeout=STOP_TIMEOUT)
    assert not thread.is_alive()
    [summary] = summaries
    assert summary.stopped and summary.abandoned == 1 and summary.batch_count == 1
    # Nothing of the abandoned batch is committed: a new run processes it again, exactly once.
    assert SparkJobRunner(job, context=spark_context, progress=None).run().records_in == 2
    assert_exact(job_file, keys)


def test_standing_run_reads_a_half_written_line_once_it_is_finished(tmp_path, spark_context):
    """A jsonl writer appends half a line, then finishes it 5 s later: a standing run waits for the
    unterminated tail (counted in the lag as bytes, never read as a record) and processes the
    record exactly once when its newline arrives."""
    job_file = write_counting_job(tmp_path, "standing-half-line", store={"backend": "memory"})
    data = tmp_path / "data"
    keys = [f"k{i % 3}" for i in range(9)]
    append(data, keys)
    late = "k1"
    target = data / f"{partition_for(late, PARTITIONS)}.jsonl"
    line = '{"key": "%s", "value": 0, "ts": 1700000000.0}\n' % late
    half = len(line) // 2
    job = load_job_config(job_file)
    lines: list[str] = []
    runner = SparkJobRunner(job, context=spark_context, progress=lines.append)
    summaries: list[Any] = []
    thread = threading.Thread(target=lambda: summaries.append(runner.run(until_drained=False)), daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while last_counts(job_file) != Counter(keys) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert last_counts(job_file) == Counter(keys)
        with target.open("a") as out:  # the writer's first half: no newline yet
            out.write(line[:half])
        pending = [runner.inputs["events"].pending_bytes(p) for p in range(PARTITIONS)]
        assert sum(pending) == half                       # visible as unterminated bytes, not as a record
        time.sleep(5)
        assert last_counts(job_file) == Counter(keys)     # nothing read from the half line meanwhile
        with target.open("a") as out:                     # 5 s later the writer finishes the line
            out.write(line[half:])
        keys.append(late)
        while last_counts(job_file) != Counter(keys) and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        runner.stop()
        thread.join(timeout=STOP_TIMEOUT)
    assert not thread.is_alive()
    assert summaries and summaries[0].stopped
    assert_exact(job_file, keys)                          # the late record counted once, nothing twice
