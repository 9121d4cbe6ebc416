"""Continuous mode (``[spark] mode = "continuous"``) through the CLI, as a service manager runs it:
long-running tasks follow appended records across epoch boundaries; a Python worker SIGKILLed while
it processes a record is retried from its partitions' last commits; SIGTERM while a record is being
processed lets the task commit and exits 0; a SIGKILLed driver resumes on restart; a processing-time
timer fires with no later record. After each, every key's emitted counts are exactly 1, 2, ..., n
against plain Python (nothing lost, nothing applied twice)."""

from __future__ import annotations

import os
import time
import signal
from collections import Counter
from pathlib import Path

import pytest

from counting_job import write_counting_job
from localstate.core.config import load_job_config
from localstate.core.stream import open_output

from .test_standing_run import (STOP_TIMEOUT, append, assert_exact, emitted, standing, wait_for_counts,
                                wait_for_file)

pytestmark = pytest.mark.spark

CONTINUOUS = {"mode": "continuous", "epoch": "3s"}  # short epochs: the tests cross their boundaries


def continuous_job(tmp_path: Path, name: str, **variant) -> Path:
    job = {"task": "standing_task:SlowOnce", "commit_interval": "50ms", **variant.pop("job", {})}
    path = write_counting_job(tmp_path, name, job=job, store={"backend": "rocksdb"}, **variant)
    path.write_text(path.read_text() + "\n[spark]\n" + "".join(f'{k} = "{v}"\n' for k, v in CONTINUOUS.items()))
    for partition in range(2):
        (tmp_path / "data").mkdir(exist_ok=True)
        (tmp_path / "data" / f"{partition}.jsonl").touch()
    return path


def test_continuous_follows_appends_across_epochs_survives_a_killed_worker_and_stops_on_sigterm(tmp_path):
    job_file = continuous_job(tmp_path, "continuous-jsonl")
    data = tmp_path / "data"
    keys = [f"user-{i % 7}" for i in range(40)]
    append(data, keys)
    process, lines = standing(job_file)
    try:
        lines.wait_for("continuous:")
        wait_for_counts(job_file, Counter(keys))
        lines.wait_for("committed", anywhere=True)
        for round_ in range(3):  # records keep coming while epochs (3 s) end and start
            more = [f"user-{(i + round_) % 5}" for i in range(30)]
            append(data, more)
            keys += more
            wait_for_counts(job_file, Counter(keys))

        # A Python worker killed while it processes a record: Spark retries the task, which reopens its
        # partitions at their last commits.
        killed = tmp_path / "killed.marker"
        append(data, ["user-1"], {"marker": str(killed), "sleep": 30})
        keys.append("user-1")
        os.kill(int(wait_for_file(killed)), signal.SIGKILL)
        more = ["user-1", "user-2", "user-6"]
        append(data, more)
        keys += more
        wait_for_counts(job_file, Counter(keys))

        # SIGTERM while a record is being processed: the task finishes it, commits, and the run exits 0.
        slow = tmp_path / "slow.marker"
        append(data, ["user-2", "user-3"], {"marker": str(slow), "sleep": 2})
        keys += ["user-2", "user-3"]
        wait_for_file(slow)
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=STOP_TIMEOUT) == 0
    finally:
        process.kill()
        process.wait()
    stdout = lines.rest()
    stderr = process.stderr.read()  # type: ignore[union-attr]
    assert "stopped:" in stdout, stdout + stderr[-3000:]
    assert "\tat org.apache" not in stderr, stderr[-3000:]
    # The killed worker's attempt is reported at WARNING when its epoch ends, naming the partition.
    warning = next(line for line in stderr.splitlines() if "task attempt 0 of partition" in line)
    assert "WARNING" in warning and "Python worker exited unexpectedly" in warning, stderr[-3000:]
    # The record in flight at SIGTERM was committed, once; what no task had read yet waits for the restart.
    counts = emitted(job_file)
    assert counts["user-2"] == list(range(1, Counter(keys)["user-2"] + 1)) or \
        counts["user-3"] == list(range(1, Counter(keys)["user-3"] + 1))
    assert all(seen == list(range(1, len(seen) + 1)) for seen in counts.values())

    # Restarted: it goes on from the committed positions; --until-drained ends once everything is read.
    append(data, ["user-9"] * 3)
    keys += ["user-9"] * 3
    process, lines = standing(job_file, "--until-drained")
    assert process.wait(timeout=300) == 0, lines.rest() + process.stderr.read()  # type: ignore[union-attr]
    assert_exact(job_file, keys)


def test_continuous_driver_sigkill_then_restart_is_exact(tmp_path):
    job_file = continuous_job(tmp_path, "continuous-kill")
    data = tmp_path / "data"
    keys = [f"user-{i % 4}" for i in range(20)]
    append(data, keys)
    process, lines = standing(job_file)
    try:
        lines.wait_for("continuous:")
        wait_for_counts(job_file, Counter(keys))
        marker = tmp_path / "slow.marker"
        append(data, ["user-1", "user-2"], {"marker": str(marker), "sleep": 5})
        keys += ["user-1", "user-2"]
        wait_for_file(marker)
        os.kill(process.pid, signal.SIGKILL)  # the driver, while a task processes a record
        process.wait(timeout=STOP_TIMEOUT)
    finally:
        process.kill()
        process.wait()
    append(data, ["user-3"] * 2)
    keys += ["user-3"] * 2
    # The killed driver's task notices within seconds and stops without committing; the restart takes
    # new generations (and the partition locks once the old task let go of them).
    process, lines = standing(job_file, "--until-drained")
    assert process.wait(timeout=300) == 0, lines.rest() + process.stderr.read()  # type: ignore[union-attr]
    assert_exact(job_file, keys)


def test_continuous_processing_time_timer_fires_with_no_later_record(tmp_path):
    job_file = continuous_job(tmp_path, "continuous-timer", job={"task": "timer_task:ReportLater"},
                              outputs={"windows": {"system": "file", "path": "windows"}}, time={"timers": True})
    append(tmp_path / "data", ["quiet"])
    process, lines = standing(job_file)
    try:
        lines.wait_for("continuous:")
        job = load_job_config(job_file)
        fired: list = []
        for _ in range(600):  # up to a minute: the timer is due 2 s after the record; nothing else arrives
            output = open_output(job, "windows")
            try:
                fired = [item for p in range(job.partitions) for item in output.read(p)]
            finally:
                output.close()
            if fired:
                break
            time.sleep(0.1)
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=STOP_TIMEOUT) == 0
    finally:
        process.kill()
        process.wait()
    assert fired == [("quiet", "idle")], lines.rest()
    assert emitted(job_file) == {}  # ReportLater emits to `windows` only
