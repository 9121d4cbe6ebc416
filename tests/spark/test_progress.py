"""The operating surface of a run on local Spark: one progress object per batch in a rotated
``progress.jsonl`` (every line parses, rows add up to the records processed, the files stay bounded),
the Prometheus endpoint scraped over real HTTP during and after the run, and ``localstate status``
on a finished job and on a job without state, writing nothing."""

from __future__ import annotations

import json
import socket
import sys
import urllib.request
from pathlib import Path

import pytest

from localstate.core.config import load_job_config
from localstate.runtime.driver.progress import PROGRESS_FILE, ProgressObserver, progress_directory
from localstate.runtime.spark.runner import SparkJobRunner
from localstate.tools.cli import main
from counting_job import final_counts, write_counting_job  # tests/ is on sys.path (tests/conftest.py)
from keyed_events import write_keyed_events

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "core"))
from fs_snapshot import snapshot  # noqa: E402

pytestmark = pytest.mark.spark

KEYS = [f"user-{i % 37}" for i in range(900)]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _scrape(port: int) -> dict[str, float]:
    """``name{labels}`` -> value of every sample the endpoint serves."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        assert response.status == 200
        text = response.read().decode()
    samples = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            samples[name] = float(value)
    return samples


DASHBOARD = Path(__file__).resolve().parents[2] / "contrib" / "grafana" / "localstate-dashboard.json"
# Counted by the runtime's late-record and misrouting checks (another change adds them): skipped while
# this run's scrape lacks them, and named here so that the skip is deliberate.
PENDING_METRICS = {"localstate_late_records_total", "localstate_misrouted_records_total"}


def dashboard_metrics() -> set[str]:
    """Every metric name the Grafana dashboard's queries use."""
    import re

    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    exprs = [target["expr"] for panel in dashboard["panels"] for target in panel.get("targets", [])]
    return {name for expr in exprs for name in re.findall(r"\b(localstate_[a-z0-9_]+)", expr)}


def assert_dashboard_queries_exist(scrape: dict[str, float]) -> None:
    """contrib/grafana's dashboard queries only metrics a live run serves (issue #48)."""
    served = {sample.split("{")[0] for sample in scrape}
    used = dashboard_metrics()
    assert len(used) >= 15 and {"localstate_lag_records", "localstate_batch_duration_seconds_bucket"} <= used
    missing = used - served - {name for name in PENDING_METRICS if name not in served}
    assert not missing, f"the dashboard queries metrics the endpoint does not serve: {sorted(missing)}"


def _progress_lines(job) -> list[dict]:
    directory = progress_directory(job)
    files = sorted(directory.glob(f"{PROGRESS_FILE}.*"), key=lambda p: -int(p.suffix[1:])) + [directory / PROGRESS_FILE]
    return [json.loads(line) for path in files for line in path.read_text().splitlines()]


def test_progress_lines_metrics_and_status(tmp_path, spark_context, capsys):
    port = _free_port()
    job_file = write_counting_job(tmp_path / "job", "progress-job", job={"metrics_port": port})
    write_keyed_events(tmp_path / "job" / "data", KEYS)
    job = load_job_config(job_file)
    runner = SparkJobRunner(job, context=spark_context, batch_size=60, progress=None)
    observer = ProgressObserver.watch(runner, max_bytes=3000, keep=2)
    seen: list[dict] = []
    during: list[dict[str, float]] = []
    observer.sinks.append(seen.append)
    observer.sinks.append(lambda progress: during.append(_scrape(port)) if progress["batch"] == 1 else None)
    try:
        summary = runner.run()
        after = _scrape(port)
    finally:
        observer.close()
    assert summary.records_in == len(KEYS) and summary.lag == 0
    assert len(seen) == len(summary.batches) >= 8

    # Every object: rows in add up, per input and in total, to the records processed.
    assert [p["batch"] for p in seen] == list(range(len(seen)))
    assert sum(p["rows_in"] for p in seen) == len(KEYS)
    assert sum(p["inputs"]["events"]["rows"] for p in seen) == len(KEYS)
    assert all(p["rows_in"] == p["inputs"]["events"]["rows"] for p in seen)
    assert sum(p["rows_out"] for p in seen) == summary.records_out
    last = seen[-1]
    assert last["lag"] == 0 and last["inputs"]["events"]["lag"] == 0
    assert set(last["inputs"]["events"]["lag_by_partition"]) == {"0", "1"}
    assert seen[0]["inputs"]["events"]["lag"] == seen[0]["lag"] > 0
    assert set(last["phases"]["driver"]) == {"plan", "spark", "checkpoint"}
    assert set(last["phases"]["tasks_ms"]) >= {"open", "read", "process", "changelog", "store_flush"}
    counts = last["state"]["stores"]["counts"]
    assert counts["bytes"] > 0 and counts["changelog_bytes"] > 0
    assert counts["keys_estimate"] is not None and counts["keys_estimate"] > 0
    assert last["failed_attempts"] == 0 and last["failed_attempt_reasons"] == []
    assert last["state"]["restore"]["records"] >= 0 and last["state"]["commit_ms"] > 0

    # On disk: rotated, bounded, every line parses, and the newest lines are the newest objects.
    directory = progress_directory(job)
    files = sorted(p.name for p in directory.glob(f"{PROGRESS_FILE}*"))
    assert files == [PROGRESS_FILE, f"{PROGRESS_FILE}.1", f"{PROGRESS_FILE}.2"], files
    assert all((directory / name).stat().st_size <= 3000 for name in files)
    lines = _progress_lines(job)
    assert lines and lines == seen[-len(lines):]
    assert len(lines) < len(seen)  # the oldest were rotated away

    # The endpoint, scraped during the run (after batch 1) and after it.
    label = 'job="progress-job"'
    assert during and during[0][f"localstate_batches_total{{{label}}}"] == 2.0
    assert after[f"localstate_batches_total{{{label}}}"] == len(seen)
    assert after[f'localstate_rows_in_total{{input="events",{label}}}'] == len(KEYS)
    assert after[f"localstate_rows_out_total{{{label}}}"] == summary.records_out
    assert after[f"localstate_failed_attempts_total{{{label}}}"] == 0
    assert after[f'localstate_input_lag_records{{input="events",{label},partition="0"}}'] == 0
    assert after[f"localstate_batch_duration_seconds_count{{{label}}}"] == len(seen)
    assert after[f"localstate_commit_duration_seconds_count{{{label}}}"] == len(seen)
    assert after[f'localstate_store_bytes{{{label},store="counts"}}'] > 0
    assert after[f'localstate_store_keys{{{label},store="counts"}}'] > 0
    assert after[f"localstate_last_batch_duration_seconds{{{label}}}"] > 0
    assert not [name for name in after if name.split("{")[0].endswith("_created")]  # no *_created series
    assert_dashboard_queries_exist(after)
    with pytest.raises(OSError):  # closed with the run
        _scrape(port)

    # `localstate status` on the finished job: not live, the last batch, lag 0; it writes nothing.
    state = tmp_path / "job" / "state"
    before = snapshot(state)
    capsys.readouterr()
    assert main(["status", str(job_file), "--json"]) == 3
    status = json.loads(capsys.readouterr().out)
    assert status["live"] is False and "stopped" in status["why"]
    assert status["last_progress"] == seen[-1]
    assert status["lag"] == 0 and status["has_state"] is True
    assert len(status["input_partitions"]) == 2
    assert main(["status", str(job_file)]) == 3
    text = capsys.readouterr().out
    assert "not running" in text and f"last batch {len(seen) - 1}" in text and "now: lag 0" in text
    assert snapshot(state) == before
    assert sum(final_counts(job).values()) == len(KEYS)  # the last count of every key


def test_status_of_a_job_without_state_creates_nothing(tmp_path, capsys):
    job_file = write_counting_job(tmp_path / "job", "never-ran")
    (tmp_path / "job" / "data").mkdir()
    before = snapshot(tmp_path)
    assert main(["status", str(job_file), "--json"]) == 3
    status = json.loads(capsys.readouterr().out)
    assert status["has_state"] is False and status["live"] is False and status["last_progress"] is None
    assert main(["status", str(job_file)]) == 3
    assert "has not run" in capsys.readouterr().out
    assert snapshot(tmp_path) == before
    assert not (tmp_path / "job" / "state").exists()
