"""progress.jsonl rotation, the live.json heartbeat as `localstate status` judges it, and the
validation of ``[job] metrics_port`` / ``metrics_host`` (no Spark)."""

from __future__ import annotations

import json
import os

import pytest

from localstate.core.config import parse_job_config
from localstate.errors import ConfigError
from localstate.runtime.driver.operating import LIVE, Found, judge_live
from localstate.runtime.driver.progress import Heartbeat, ProgressLog, read_last_progress

JOB = {"job": {"name": "j", "partitions": 1, "task": "x:Y"}}
PROGRESS = {"timestamp": "2025-01-01T00:00:00.000Z", "duration_ms": 1.0, "rows_in": 1, "rows_out": 1, "lag": 0}


def is_live(live, **kwargs):
    return judge_live(Found(live), **kwargs)[0] == LIVE


def test_rotation_keeps_a_bounded_number_of_bounded_files(tmp_path):
    log = ProgressLog(tmp_path, max_bytes=500, keep=3)
    for batch in range(200):
        log.append({"batch": batch, "pad": "x" * 80})
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["progress.jsonl", "progress.jsonl.1", "progress.jsonl.2", "progress.jsonl.3"]
    assert all(p.stat().st_size <= 500 for p in tmp_path.iterdir())
    batches = [json.loads(line)["batch"] for path in reversed(log.files()) for line in path.read_text().splitlines()]
    assert batches == list(range(200 - len(batches), 200))  # contiguous, newest last


def test_last_progress_skips_a_torn_line(tmp_path):
    job = parse_job_config({**JOB, "job": {**JOB["job"], "state_dir": str(tmp_path)}}, base_dir=tmp_path)
    directory = tmp_path / "j" / "progress"
    log = ProgressLog(directory)
    log.append({**PROGRESS, "batch": 1})
    log.append({**PROGRESS, "batch": 2})
    with open(directory / "progress.jsonl", "ab") as handle:
        handle.write(b'{"batch": 3, "tor')
    found = read_last_progress(job)
    assert found.value == {**PROGRESS, "batch": 2} and "1 damaged line(s) after batch 2" in found.problems[0]


def test_heartbeat_live_then_stopped(tmp_path):
    beat = Heartbeat(tmp_path, "run-1", interval=0.05)
    beat.start()
    live = json.loads((tmp_path / "live.json").read_text())
    assert live["pid"] == os.getpid() and live["state"] == "running"
    assert is_live(live)
    assert not is_live(live, now=live["heartbeat"] + 100)  # stale
    assert not is_live({**live, "pid": 2 ** 22 + 12345})  # a pid that does not exist
    beat.stop()
    stopped = json.loads((tmp_path / "live.json").read_text())
    assert stopped["state"] == "stopped" and not is_live(stopped)
    assert not is_live(None)


@pytest.mark.parametrize("port", [0, 65536, -1, "9100", True, 1.5])
def test_metrics_port_must_be_a_port(tmp_path, port):
    with pytest.raises(ConfigError) as caught:
        parse_job_config({"job": {**JOB["job"], "metrics_port": port}}, base_dir=tmp_path)
    assert [p.path for p in caught.value.problems] == ["job.metrics_port"]


def test_metrics_port_and_host(tmp_path):
    job = parse_job_config(JOB, base_dir=tmp_path)
    assert job.metrics_port is None and job.metrics_host == "127.0.0.1"
    job = parse_job_config({"job": {**JOB["job"], "metrics_port": 9100, "metrics_host": "0.0.0.0"}}, base_dir=tmp_path)
    assert job.metrics_port == 9100 and job.metrics_host == "0.0.0.0"
    with pytest.raises(ConfigError):
        parse_job_config({"job": {**JOB["job"], "metrics_host": ""}}, base_dir=tmp_path)


def test_two_registries_in_one_process():
    from localstate.runtime.driver.metrics import JobMetrics

    first, second = JobMetrics("a"), JobMetrics("a")  # same names, separate registries: no clash
    first.observe({"batch": 0, "rows_in": 5, "rows_out": 1, "duration_ms": 10.0, "inputs": {}, "state": {}})
    assert first.registry.get_sample_value("localstate_rows_in_total", {"job": "a", "input": ""}) == 5
    assert second.registry.get_sample_value("localstate_rows_in_total", {"job": "a", "input": ""}) is None


def test_status_of_a_live_run(tmp_path, capsys):
    from localstate.core.config import load_job_config
    from localstate.runtime.driver.progress import progress_directory
    from localstate.tools.cli import main

    (tmp_path / "data").mkdir()
    job_file = tmp_path / "job.toml"
    job_file.write_text('[job]\nname = "live"\ntask = "x:Y"\n[inputs.events]\nsystem = "jsonl"\npath = "data"\n')
    job = load_job_config(job_file)
    beat = Heartbeat(progress_directory(job), "run-7", interval=0.05)
    beat.start()
    try:
        assert main(["status", str(job_file), "--json"]) == 0
        status = json.loads(capsys.readouterr().out)
        assert status["live"] is True and status["run"]["run_id"] == "run-7"
        assert status["last_progress"] is None
    finally:
        beat.stop()
    assert main(["status", str(job_file)]) == 3
    assert "not running" in capsys.readouterr().out


def test_failed_attempt_reasons_are_json_objects_in_progress_and_status(tmp_path, capsys):
    """A retried attempt's reason is a JSON object in progress.jsonl (not the text of a Python dict),
    and `localstate status` shows it as one line."""
    from pathlib import Path

    from localstate.core.config import load_job_config
    from localstate.runtime.driver.progress import REASON_FIELDS, ProgressReport, progress_directory
    from localstate.runtime.driver.plan import BatchResult
    from localstate.tools.cli import main

    (tmp_path / "data").mkdir()
    job_file = tmp_path / "job.toml"
    job_file.write_text('[job]\nname = "retried"\ntask = "x:Y"\n[inputs.events]\nsystem = "jsonl"\npath = "data"\n')
    job = load_job_config(job_file)
    killed = {"batch": 3, "partition": 1, "attempt": 0, "type": "WorkerExited", "host": "host-a", "pid": 4321,
              "message": "Python worker exited unexpectedly (attempt 0 of partition 1)"}
    odd = {"batch": 3, "partition": None, "attempt": 1, "type": "OSError", "message": Path("/x"), "host": None}
    result = BatchResult(3, records_in=5, tasks=2, failed_attempts=2, failed_attempt_reasons=[killed, odd])
    progress = ProgressReport.from_batch(job, result, [], run_id="r")
    ProgressLog(progress_directory(job)).append(progress)

    [line] = (progress_directory(job) / "progress.jsonl").read_text().splitlines()
    reasons = json.loads(line)["failed_attempt_reasons"]
    assert reasons == [{name: killed[name] for name in REASON_FIELDS},
                       {"batch": 3, "partition": None, "attempt": 1, "type": "OSError", "message": "/x", "host": None}]
    assert main(["status", str(job_file)]) == 3
    text = capsys.readouterr().out
    assert "2 failed attempt(s) retried" in text
    assert ("failed attempt: batch 3 partition 1 attempt 0 on host-a: WorkerExited: Python worker exited "
            "unexpectedly (attempt 0 of partition 1)") in text
    assert "failed attempt: batch 3 a slot attempt 1: OSError: /x" in text
