"""Late records are never dropped silently (issue 43 item 2): each window store counts what it drops
(``context.counters``, ``late_records``), the runtime reports the counts with each committed batch
(progress.jsonl, ``localstate status``, Prometheus), exactly across crashes and replays, and the
first late record of a batch is logged with its key and timestamp, once per batch."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from localstate.core.config import load_job_config, parse_job_config
from localstate.core.task import BatchTask, StreamTask, TaskCounters, merge_counts
from localstate.testing.driver import TaskTestDriver
from localstate.windows import Hopping, Session, Tumbling, WindowedAggregation, count

BASE = 1_700_000_000.0
KINDS = {"tumbling": Tumbling(10), "hopping": Hopping(10, 5), "session": Session(7)}


def _task(kind: str, late_output: str | None = None, batch: bool = False) -> type[StreamTask]:
    class Windowed(BatchTask if batch else StreamTask):  # type: ignore[misc, valid-type]
        def init(self, context: Any) -> None:
            self.windows = WindowedAggregation(context, KINDS[kind], count(), store="windows", output="out",
                                               late_output=late_output)

        def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
            self.windows.add(envelope.key, envelope.value, envelope.timestamp, collector)

        def process_batch(self, rows: Any, collector: Any, coordinator: Any) -> None:
            self.windows.add_batch(rows.column("key"), rows.column("value").to_pylist(), rows.column("timestamp"),
                                   collector)

        def on_timer(self, key: Any, timestamp: float, collector: Any, coordinator: Any) -> None:
            self.windows.on_timer(key, timestamp, collector)

    return Windowed


def _job(tmp: Path) -> Any:
    return parse_job_config({
        "job": {"name": "late", "partitions": 1, "task": "unused:Unused", "state_dir": str(tmp),
                "commit_interval": 10 ** 9},
        "time": {"timers": True},
        "stores": {"windows": {"engine": "kv", "backend": "memory", "key_serde": "string", "value_serde": "json"}},
        "changelogs": {"file": {}}}, base_dir=tmp)


def _late_in(stream: list[tuple[str, float]], kind: str) -> int:
    """How many records of ``stream`` arrive after every window they belong to closed (the reference:
    windows close when the largest timestamp seen reaches their end)."""
    late, high = 0, None
    sessions: dict[str, list[tuple[float, float]]] = {}
    for key, ts in stream:
        if kind == "session":
            if high is not None:  # a session closed once the watermark reached its end: it takes no more
                sessions[key] = [s for s in sessions.get(key, []) if s[1] > high]
            opened = (ts, ts + 7)
            joined = [s for s in sessions.get(key, []) if s[0] <= opened[1] and s[1] >= opened[0]]
            if not joined and high is not None and opened[1] <= high:
                late += 1
            else:
                start = min([opened[0], *(s[0] for s in joined)])
                end = max([opened[1], *(s[1] for s in joined)])
                sessions[key] = [s for s in sessions.get(key, []) if s not in joined] + [(start, end)]
        else:
            window = KINDS[kind]
            ends = [window.window(i).end for i in window.indexes(ts)]  # type: ignore[attr-defined]
            if high is not None and all(end <= high for end in ends):
                late += 1
        high = ts if high is None else max(high, ts)
    return late


streams = st.lists(st.tuples(st.sampled_from(["a", "b"]), st.integers(0, 80).map(lambda t: BASE + t / 2)),
                   min_size=1, max_size=40)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(stream=streams, kind=st.sampled_from(sorted(KINDS)), crash_at=st.one_of(st.none(), st.integers(0, 40)))
def test_late_records_are_counted_exactly_across_a_crash(tmp_path_factory: Any, stream: list[tuple[str, float]],
                                                         kind: str, crash_at: int | None) -> None:
    with TaskTestDriver(_task(kind), job=_job(tmp_path_factory.mktemp("late"))) as driver:
        for i, (key, ts) in enumerate(stream):
            driver.send("events", key, 1, timestamp=ts)
            if crash_at is not None and i == crash_at // 2:
                driver.commit()
            if crash_at is not None and i == crash_at:
                driver.crash()
                driver.restart()  # the uncommitted records again: their late ones counted once
        driver.commit()
        expected = _late_in(stream, kind)
        assert driver.counts().get("late_records", {}).get("windows", 0) == expected


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_late_records_go_to_late_output_and_are_counted_for_a_batch_task_too(tmp_path: Path, kind: str) -> None:
    stream = [("a", BASE + 30), ("a", BASE), ("b", BASE + 1), ("a", BASE + 29.5)]
    rows = [("events", key, 1, ts) for key, ts in stream]
    for batch in (False, True):
        with TaskTestDriver(_task(kind, late_output="late", batch=batch), job=_job(tmp_path / str(batch))) as driver:
            if batch:
                driver.send_rows(rows)
            else:
                for _stream, key, value, ts in rows:
                    driver.send("events", key, value, timestamp=ts)
            driver.commit()
            expected = _late_in(stream, kind)
            assert driver.counts() == ({"late_records": {"windows": expected}} if expected else {})
            assert len(driver.outputs("late")) == expected


def test_the_first_late_record_of_each_batch_is_logged_once(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with TaskTestDriver(_task("tumbling"), job=_job(tmp_path)) as driver, \
            caplog.at_level(logging.WARNING, logger="localstate.windows.operator"):
        driver.send("events", "a", 1, timestamp=BASE + 100)
        for i in range(5):
            driver.send("events", f"k{i}", 1, timestamp=BASE + i)  # all late
        driver.commit()
        for i in range(3):
            driver.send("events", "z", 1, timestamp=BASE + 1)
        driver.commit()
        logged = [r.getMessage() for r in caplog.records if "late record" in r.getMessage()]
        assert len(logged) == 2
        assert "key 'k0'" in logged[0] and repr(BASE) in logged[0] and "'windows'" in logged[0]
        assert driver.counts() == {"late_records": {"windows": 8}}


def test_counters_take_what_was_added_since_the_last_take() -> None:
    counters = TaskCounters()
    assert counters.add("late_records", "w") == 1
    assert counters.add("late_records", "w", 2) == 3
    assert counters.add("misrouted", "in") == 1
    assert counters.take() == {"late_records": {"w": 3}, "misrouted": {"in": 1}}
    assert counters.take() == {}
    totals: dict[str, dict[str, int]] = {}
    merge_counts(totals, {"late_records": {"w": 3}})
    merge_counts(totals, {"late_records": {"w": 1, "v": 2}})
    assert totals == {"late_records": {"w": 4, "v": 2}}


def test_late_counts_reach_progress_status_and_prometheus(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from prometheus_client import generate_latest

    from localstate.runtime.driver.metrics import JobMetrics
    from localstate.runtime.driver.progress import ProgressLog, ProgressReport, progress_directory
    from localstate.runtime.driver.plan import BatchResult, RunSummary, progress_line
    from localstate.tools.cli import main

    (tmp_path / "data").mkdir()
    job_file = tmp_path / "job.toml"
    job_file.write_text('[job]\nname = "late"\ntask = "x:Y"\n[inputs.events]\nsystem = "jsonl"\npath = "data"\n')
    job = load_job_config(job_file)
    result = BatchResult(7, records_in=10, tasks=1, counts={"late_records": {"hourly": 3, "daily": 1},
                                                             "misrouted": {"events": 2}})
    assert "late records 4" in progress_line(result, 1) and "misrouted 2" in progress_line(result, 1)
    progress = ProgressReport.from_batch(job, result, [], run_id="r")
    assert progress["late_records"] == {"hourly": 3, "daily": 1} and progress["misrouted"] == {"events": 2}
    ProgressLog(progress_directory(job)).append(progress)
    assert json.loads((progress_directory(job) / "progress.jsonl").read_text())["late_records"]["hourly"] == 3
    assert main(["status", str(job_file)]) == 3
    text = capsys.readouterr().out
    assert "window store 'hourly' dropped 3 late record(s)" in text and "input 'events' had 2 misrouted" in text
    metrics = JobMetrics("late")
    metrics.observe(progress)
    metrics.observe(progress)
    exposed = generate_latest(metrics.registry).decode()
    assert 'localstate_late_records_total{job="late",store="hourly"} 6.0' in exposed
    assert 'localstate_misrouted_records_total{input="events",job="late"} 4.0' in exposed
    summary = RunSummary(keep=1)
    summary.add(result)
    summary.add(BatchResult(8))
    assert summary.folded is not None and summary.folded.counts["late_records"]["hourly"] == 3
