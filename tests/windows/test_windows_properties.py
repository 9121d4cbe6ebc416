"""The windows library against its plain-Python reference model (localstate.windows.reference),
over random out-of-order streams, through TaskTestDriver on the real kv engine, timers and file
changelog: tumbling, hopping and session windows; emit final and update; lateness; late records
dropped or sent to a side output; a crash and restart in the middle."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from localstate.core.config import parse_job_config
from localstate.core.task import StreamTask
from localstate.testing.driver import TaskTestDriver
from localstate.windows import (Hopping, Session, Tumbling, WindowedAggregation, count, max_of, min_of, reduce,
                                 sum_of)
from localstate.windows.reference import reference_windows, watermarks

BASE = 1_700_000_000.0

KINDS = {"tumbling": Tumbling(10), "hopping": Hopping(10, 5), "session": Session(7)}
AGGREGATES = {"count": count(), "sum": sum_of(), "min": min_of(), "max": max_of(),
              "reduce": reduce(lambda a, b: (a * 31 + b) % 1009 if a <= b else (b * 31 + a) % 1009)}
# (reduce: commutative, so a window's result does not depend on arrival order when sessions merge)


def windowed_task(kind: str, aggregate: str, emit: str, lateness: float, late_output: str | None) -> type[StreamTask]:
    class Windowed(StreamTask):
        def init(self, context: Any) -> None:
            self.windows = WindowedAggregation(context, KINDS[kind], AGGREGATES[aggregate], store="windows",
                                               output="out", emit=emit, lateness=lateness, late_output=late_output)

        def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
            self.windows.add(envelope.key, envelope.value, envelope.timestamp, collector)

    return Windowed


def job(state_dir: Path, allowed_lateness: float, timer_key_serde: str = "json") -> Any:
    """The windows' timers are in their namespaces: the job's timer key serde does not matter to them."""
    time_table: dict[str, Any] = {"timers": True, "timer_key_serde": timer_key_serde}
    if allowed_lateness:
        time_table["allowed_lateness"] = allowed_lateness
    return parse_job_config({
        "job": {"name": "windows", "partitions": 1, "task": "unused:Unused", "state_dir": str(state_dir),
                "commit_interval": 10 ** 9},
        "time": time_table,
        "stores": {"windows": {"engine": "kv", "backend": "rocksdb", "key_serde": "string", "value_serde": "json"}},
        # fsync off: what is checked is the windows and a process crash, not a machine crash (the
        # changelog's durability has its own tests); each example commits many times
        "changelogs": {"file": {"fsync": False}}}, base_dir=state_dir)


records = st.lists(st.tuples(st.sampled_from(["a", "b", "c"]), st.integers(min_value=-50, max_value=50),
                             st.integers(min_value=0, max_value=120).map(lambda half: BASE + half / 2)),
                   min_size=1, max_size=60)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(stream=records, kind=st.sampled_from(sorted(KINDS)), aggregate=st.sampled_from(sorted(AGGREGATES)),
       emit=st.sampled_from(["final", "update"]), lateness=st.sampled_from([0.0, 4.0]),
       allowed_lateness=st.sampled_from([0.0, 3.0]), side_output=st.booleans(),
       crash_after=st.one_of(st.none(), st.integers(min_value=0, max_value=60)),
       timer_key_serde=st.sampled_from(["json", "string", "int"]))
def test_windows_match_the_reference(tmp_path_factory: pytest.TempPathFactory, stream: list[tuple[str, int, float]],
                                     kind: str, aggregate: str, emit: str, lateness: float, allowed_lateness: float,
                                     side_output: bool, crash_after: int | None, timer_key_serde: str) -> None:
    late_output = "late" if side_output else None
    task = windowed_task(kind, aggregate, emit, lateness, late_output)
    with TaskTestDriver(task, job=job(tmp_path_factory.mktemp("w"), allowed_lateness, timer_key_serde)) as driver:
        for i, (key, value, ts) in enumerate(stream):
            driver.send("events", key, value, timestamp=ts)
            if crash_after is not None and i == crash_after // 2:
                driver.commit()
            if crash_after is not None and i == crash_after:
                driver.crash()
                driver.restart()  # re-delivers every record after the commit
        driver.commit()
        sent = [(k, v["start"], v["end"], v["value"]) for k, v in driver.outputs("out")]
        late = driver.outputs("late") if side_output else []

    # The watermark a record is processed under: the largest timestamp fed so far, its own included,
    # minus the allowed lateness (the feed loop raises it before process()).
    marks = watermarks([ts for _, _, ts in stream], allowed_lateness)
    expected = reference_windows([(k, v, ts, w) for (k, v, ts), w in zip(stream, marks)], KINDS[kind],
                                 AGGREGATES[aggregate], emit=emit, lateness=lateness, final_watermark=marks[-1])
    wanted = [(k, w.start, w.end, value) for k, w, value in expected.outputs]
    if emit == "final":
        assert Counter(sent) == Counter(wanted)
        assert len(set((k, s, e) for k, s, e, _ in sent)) == len(sent), "a window was emitted twice"
    else:
        assert sent == wanted
    assert late == (expected.late if side_output else [])


def batch_windowed_task(kind: str, aggregate: str, emit: str, lateness: float) -> type:
    from localstate.core.task import BatchTask

    class WindowedBatch(BatchTask):
        def init(self, context: Any) -> None:
            self.windows = WindowedAggregation(context, KINDS[kind], AGGREGATES[aggregate], store="windows",
                                               output="out", emit=emit, lateness=lateness, late_output="late")

        def process_batch(self, batch: Any, collector: Any, coordinator: Any) -> None:
            self.windows.add_batch(batch.column("key"), batch.column("value"), batch.column("timestamp"), collector)

    return WindowedBatch


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(stream=records, cuts=st.lists(st.integers(min_value=1, max_value=60), max_size=6),
       kind=st.sampled_from(sorted(KINDS)), aggregate=st.sampled_from(["count", "sum"]),
       emit=st.sampled_from(["final", "update"]), lateness=st.sampled_from([0.0, 4.0]),
       allowed_lateness=st.sampled_from([0.0, 3.0]), crash=st.booleans())
def test_batch_tasks_match_the_reference_whatever_the_batches(
        tmp_path_factory: pytest.TempPathFactory, stream: list[tuple[str, int, float]], cuts: list[int], kind: str,
        aggregate: str, emit: str, lateness: float, allowed_lateness: float, crash: bool) -> None:
    """add_batch judges each row by the watermark it would have had per record: the outputs are
    the reference's however the stream is cut into batches (the tumbling count runs vectorised)."""
    bounds = sorted({0, len(stream), *(c for c in cuts if c < len(stream))})
    task = batch_windowed_task(kind, aggregate, emit, lateness)
    with TaskTestDriver(task, job=job(tmp_path_factory.mktemp("b"), allowed_lateness)) as driver:
        for number, (start, end) in enumerate(zip(bounds, bounds[1:])):
            chunk = stream[start:end]
            driver.send_batch("events", [k for k, _, _ in chunk], [v for _, v, _ in chunk], partition=0,
                              timestamps=[ts for *_, ts in chunk])
            if crash and number == 0:
                driver.commit()
            if crash and number == 1:
                driver.crash()
                driver.restart()
        driver.commit()
        sent = [(k, v["start"], v["end"], v["value"]) for k, v in driver.outputs("out")]
        late = driver.outputs("late")
    marks = watermarks([ts for _, _, ts in stream], allowed_lateness)
    expected = reference_windows([(k, v, ts, w) for (k, v, ts), w in zip(stream, marks)], KINDS[kind],
                                 AGGREGATES[aggregate], emit=emit, lateness=lateness, final_watermark=marks[-1])
    wanted = [(k, w.start, w.end, value) for k, w, value in expected.outputs]
    assert (Counter(sent) == Counter(wanted)) if emit == "final" else (sent == wanted)
    assert late == expected.late


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(stream=records, kind=st.sampled_from(sorted(KINDS)), emit=st.sampled_from(["final", "update"]),
       lateness=st.sampled_from([0.0, 4.0]))
def test_advancing_event_time_closes_every_window_and_empties_the_stores(
        tmp_path_factory: pytest.TempPathFactory, stream: list[tuple[str, int, float]], kind: str, emit: str,
        lateness: float) -> None:
    """With event time moved past every window (TaskTestDriver.advance_event_time), every window the
    reference opened is sent (final) and every window's state is gone from the store."""
    task = windowed_task(kind, "count", emit, lateness, None)
    with TaskTestDriver(task, job=job(tmp_path_factory.mktemp("a"), 0.0)) as driver:
        for key, value, ts in stream:
            driver.send("events", key, value, timestamp=ts)
        driver.advance_event_time(BASE + 10_000)
        driver.commit()
        sent = [(k, v["start"], v["end"], v["value"]) for k, v in driver.outputs("out")]
        with driver.store("windows").all() as left:
            assert list(left) == []
    marks = watermarks([ts for _, _, ts in stream])
    expected = reference_windows([(k, v, ts, w) for (k, v, ts), w in zip(stream, marks)], KINDS[kind], count(),
                                 emit=emit, lateness=lateness, final_watermark=BASE + 10_000)
    assert not expected.open
    wanted = [(k, w.start, w.end, value) for k, w, value in expected.outputs]
    assert (Counter(sent) == Counter(wanted)) if emit == "final" else (sent == wanted)


def test_a_session_closed_within_a_batch_takes_no_more_records(tmp_path: Path) -> None:
    """Timers fire at batch boundaries: within one batch a session can be closed (its end passed by
    the watermark) before its timer fires. It is sent then, and a record at its very start that
    joins a later session does not land in it."""
    stream = [("k", 1, BASE + 0), ("k", 1, BASE + 40), ("k", 1, BASE + 12), ("k", 1, BASE + 0)]
    KINDS["session30"] = Session(30)
    try:
        task = windowed_task("session30", "count", "final", 0.0, "late")
        with TaskTestDriver(task, job=job(tmp_path, 0.0)) as driver:
            driver.send_batch("events", [k for k, _, _ in stream], [v for _, v, _ in stream], partition=0,
                              timestamps=[ts for *_, ts in stream])
            driver.advance_event_time(BASE + 1000)
            driver.commit()
            sent = sorted((v["start"] - BASE, v["end"] - BASE, v["value"]) for _, v in driver.outputs("out"))
    finally:
        del KINDS["session30"]
    assert sent == [(0.0, 30.0, 1), (0.0, 70.0, 3)]
