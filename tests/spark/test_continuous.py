"""Continuous mode (``[spark] mode = "continuous"``) through the CLI, as a service manager runs it:
long-running tasks follow appended records across epoch boundaries; a Python worker SIGKILLed while
it processes a record is retried from its partitions' last commits; SIGTERM while a record is being
processed lets the task commit and exits 0; a SIGKILLed driver resumes on restart; a processing-time
timer fires with no later record. After each, every key's emitted counts are exactly 1, 2, ..., n
against plain Python (nothing lost, nothing applied twice)."""

from __future__ import annotations

import signal
import subprocess
import time
from collections import Counter
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pytest

from counting_job import write_counting_job
from localstate.core.config import load_job_config
from localstate.core.stream import open_output

from .test_standing_run import (STOP_TIMEOUT, Lines, append, assert_exact, emitted, kill_a_worker_mid_record,
                                kill_the_driver_mid_record, killed_on_exit, sigterm_mid_record, standing,
                                stopped_output, wait_for_counts)

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


@contextmanager
def continuous_run(tmp_path: Path, name: str, keys: list[str]) -> Iterator[tuple[Path, subprocess.Popen, Lines]]:
    """A continuous run of a fresh job over ``keys``, once it has counted them; killed when the block is left."""
    job_file = continuous_job(tmp_path, name)
    append(tmp_path / "data", keys)
    process, lines = standing(job_file)
    with killed_on_exit(process):
        lines.wait_for("continuous:")
        wait_for_counts(job_file, Counter(keys))
        yield job_file, process, lines


def restart_until_drained(job_file: Path, keys: list[str]) -> None:
    """Restart the job with ``--until-drained``: it exits 0 and every key's counts are exact."""
    process, lines = standing(job_file, "--until-drained")
    assert process.wait(timeout=300) == 0, lines.rest() + process.stderr.read()  # type: ignore[union-attr]
    assert_exact(job_file, keys)


def test_continuous_follows_appends_across_epochs_survives_a_killed_worker_and_stops_on_sigterm(tmp_path):
    data = tmp_path / "data"
    keys = [f"user-{i % 7}" for i in range(40)]
    with continuous_run(tmp_path, "continuous-jsonl", keys) as (job_file, process, lines):
        lines.wait_for("committed", anywhere=True)
        for round_ in range(3):  # records keep coming while epochs (3 s) end and start
            more = [f"user-{(i + round_) % 5}" for i in range(30)]
            append(data, more)
            keys += more
            wait_for_counts(job_file, Counter(keys))

        # A Python worker killed while it processes a record: Spark retries the task, which reopens its
        # partitions at their last commits.
        kill_a_worker_mid_record(data, keys, tmp_path / "killed.marker")
        more = ["user-1", "user-2", "user-6"]
        append(data, more)
        keys += more
        wait_for_counts(job_file, Counter(keys))

        # SIGTERM while a record is being processed: the task finishes it, commits, and the run exits 0.
        sigterm_mid_record(process, data, keys, tmp_path / "slow.marker", sleep=2)
    # The killed worker's attempt is reported at WARNING when its epoch ends, naming the partition.
    stdout, stderr = stopped_output(process, lines)
    assert "\tat org.apache" not in stderr, stderr[-3000:]
    # The record in flight at SIGTERM was committed, once; what no task had read yet waits for the restart.
    counts = emitted(job_file)
    assert counts["user-2"] == list(range(1, Counter(keys)["user-2"] + 1)) or \
        counts["user-3"] == list(range(1, Counter(keys)["user-3"] + 1))
    assert all(seen == list(range(1, len(seen) + 1)) for seen in counts.values())

    # Restarted: it goes on from the committed positions; --until-drained ends once everything is read.
    append(data, ["user-9"] * 3)
    keys += ["user-9"] * 3
    restart_until_drained(job_file, keys)


def test_continuous_driver_sigkill_then_restart_is_exact(tmp_path):
    data = tmp_path / "data"
    keys = [f"user-{i % 4}" for i in range(20)]
    with continuous_run(tmp_path, "continuous-kill", keys) as (job_file, process, lines):
        # the driver, while a task processes a record
        kill_the_driver_mid_record(process, data, keys, tmp_path / "slow.marker", sleep=5)
    append(data, ["user-3"] * 2)
    keys += ["user-3"] * 2
    # The killed driver's task notices within seconds and stops without committing; the restart takes
    # new generations (and the partition locks once the old task let go of them).
    restart_until_drained(job_file, keys)


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
