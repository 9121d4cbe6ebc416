"""Event time checked where it enters (issue 43 item 2), on every input system, by one rule
(``TimestampRule``): a timestamp of the wrong type (a boolean, a string, a list, an object), not
finite (NaN, infinity, beyond a double) or outside the input's plausible range (``min_timestamp`` to
``max_timestamp`` after ``timestamp_unit``) is a bad record under ``on_error``, never an event time;
plausible ones in any unit become seconds, on the per-record and the columnar paths alike. Without
Spark: readers, the executor's feed (``run_partition``), the DataFrame step's row conversion and the
TaskTestDriver are driven directly."""

from __future__ import annotations

import math
import pickle
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from localstate.changelog.file import FileChangelogSystem
from localstate.core.config import parse_job_config
from localstate.core.stream import open_input
from localstate.core.stream import NO_BOUNDS, BadTimestamp, TimestampRule, timestamp_rule
from localstate.core.event_time import DEFAULT_MAX_TIMESTAMP, DEFAULT_MIN_TIMESTAMP
from localstate.core.task import StreamTask
from localstate.errors import ConfigError, TimestampError
from localstate.testing.driver import TaskTestDriver

HERE = Path(__file__).parent

#: hostile timestamps as JSON text (what a producer may write), by what they are
HOSTILE = {
    "true": "true", "false": "false", "string": '"12.5"', "numeric string": '"1700000000"', "list": "[1]",
    "object": '{"s": 1}', "NaN": "NaN", "Infinity": "Infinity", "-Infinity": "-Infinity", "1e400": "1e400",
    "milliseconds": "1700000000000", "microseconds": "1700000000000000", "nanoseconds": "1700000000000000000",
    "negative": "-5", "tiny negative": "-5e-324", "1969": "-86400", "year 3000": "32503680000",
    "beyond 2**64": "18446744073709551617", "huge": "1e300",
}
GOOD = [1_700_000_000, 1_700_000_000.5, 0, 5e-324, 31_536_000, 7_258_118_400]  # 0: a logical clock's start
#: texts the strict json serde refuses before any timestamp is looked at (a bad record either way)
SERDE_REFUSES = {"NaN", "Infinity", "-Infinity", "1e400", "beyond 2**64"}


def _job(tmp: Path, system: str, **events: Any) -> Any:
    source = {"system": system, "path": str(tmp / "data")}
    return parse_job_config({"job": {"name": "ts", "partitions": 1, "task": "poison_task:KeepLast",
                                     "state_dir": "state", "pythonpath": [str(HERE)]},
                             "inputs": {"events": {**source, **events}},
                             "outputs": {"out": {"system": "file", "path": "out"},
                                         "dead": {"system": "file", "path": "dead"}},
                             "stores": {"last": {"engine": "kv", "key_serde": "json", "value_serde": "json"}}}, base_dir=tmp, source=str(tmp / "job.toml"))


def _write(tmp: Path, system: str, stamps: list[str]) -> None:
    """Records ``k<i>`` with ``ts`` as the JSON text ``stamps[i]``."""
    if system == "jsonl":
        (tmp / "data").mkdir(exist_ok=True)
        (tmp / "data" / "0.jsonl").write_text("".join(f'{{"key":"k{i}","value":{i},"ts":{ts}}}\n'
                                                      for i, ts in enumerate(stamps)))
        return
    logs = FileChangelogSystem({"path": str(tmp / "data")}, tmp)
    logs.ensure_stream("events", 1)
    writer = logs.partition("events", 0)
    writer.append_many([(f'"k{i}"'.encode(), f'{{"n":{i},"ts":{ts}}}'.encode()) for i, ts in enumerate(stamps)])
    writer.flush()
    writer.close()


def _read(job: Any, n: int, columns: bool) -> list[tuple[int, Any]]:
    """``(offset, seconds)`` of each good record, ``(offset, the bad record's error)`` of each bad one."""
    source = open_input(job, "events")
    if not columns:
        return [(r.offset, r.ts if r.error is None else r.error) for r in source.read(0, 0, n)]
    rows: list[tuple[int, Any]] = []
    for chunk in source.read_columns(0, 0, n):
        times = chunk.timestamps.to_pylist() if hasattr(chunk.timestamps, "to_pylist") else chunk.timestamps
        rows += list(zip(chunk.offsets, times)) + [(r.offset, r.error) for r in chunk.bad]
    return sorted(rows, key=lambda row: row[0])


@pytest.mark.parametrize("system", ["jsonl", "file"])
@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_a_hostile_timestamp_is_a_bad_record_on_every_read_path(tmp_path: Path, system: str, case: str) -> None:
    good = [str(ts) for ts in GOOD]
    _write(tmp_path, system, good[:2] + [HOSTILE[case]] + good[2:] * 300)  # past a column chunk, for Arrow
    job = _job(tmp_path, system)
    n = 3 + 2 * 300
    for columns in (False, True):
        rows = _read(job, n, columns)
        assert len(rows) == n
        offset, error = rows[2]
        if case in SERDE_REFUSES and "undecodable" in error:  # the json serde refuses the text first
            continue
        assert getattr(error, "error_type", None) is TimestampError, (columns, error)
        assert error.context["timestamp"]
        assert [ts for _, ts in rows[:2]] == [float(GOOD[0]), float(GOOD[1])]  # good ones are untouched
        assert all(isinstance(ts, float) for _, ts in rows[3:])


@pytest.mark.parametrize("on_error", ["fail", "skip", "dead_letter"])
def test_the_bad_timestamp_follows_on_error_with_a_typed_error_naming_it(tmp_path: Path, on_error: str) -> None:
    from localstate.core.checkpoint import Checkpoint  # noqa: F401 - the executor's result is a checkpoint dict
    from localstate.core.stream import open_output
    from localstate.runtime.spark.affinity.kept import release_kept
    from localstate.runtime.spark.runner import PartitionPlan, run_partition

    _write(tmp_path, "jsonl", ["1700000000", "1700000000123", "true", "1700000001"])
    job = _job(tmp_path, "jsonl", on_error=on_error, **({"dead_letter": "dead"} if on_error == "dead_letter" else {}))
    result = run_partition(job, PartitionPlan(batch=0, partition=0, ranges={"events": (0, 4)}, limit=None))
    release_kept()
    if on_error == "fail":
        error = pickle.loads(result["error"])
        assert isinstance(error, TimestampError)
        assert (error.context["stream"], error.context["partition"], error.context["offset"]) == ("events", 0, 1)
        assert error.context["timestamp"] == "1700000000123" and "timestamp_unit = 'ms'" in str(error)
        return
    assert result["in"] == 4 and (result["skipped"] if on_error == "skip" else result["dead"]) == 2
    if on_error == "dead_letter":
        dead = [value for _, value in open_output(job, "dead").read(0)]
        assert [d["offset"] for d in dead] == [1, 2] and "is a boolean" in dead[1]["error"]


@settings(max_examples=30, deadline=None)
@given(unit=st.sampled_from(["s", "ms", "us", "ns"]),
       seconds=st.integers(int(DEFAULT_MIN_TIMESTAMP), int(DEFAULT_MAX_TIMESTAMP)), fraction=st.integers(0, 999))
def test_every_unit_becomes_seconds_the_same_way_per_record_and_per_column(tmp_path_factory: Any, unit: str,
                                                                           seconds: int, fraction: int) -> None:
    tmp = tmp_path_factory.mktemp("units")
    per = {"s": 1, "ms": 1000, "us": 1_000_000, "ns": 1_000_000_000}[unit]
    raw = seconds * per + (fraction * per // 1000 if per > 1 else 0)
    _write(tmp, "jsonl", [str(raw)] * (4097 + fraction % 3))
    job = _job(tmp, "jsonl", timestamp_unit=unit)
    n = 4097 + fraction % 3
    per_record, per_column = _read(job, n, False), _read(job, n, True)
    assert per_record == per_column
    assert {ts for _, ts in per_record} == {float(raw) / per if per > 1 else float(raw)}


@pytest.mark.parametrize(("options", "path"), [
    ({"timestamp_unit": "minutes"}, "inputs.events.timestamp_unit"),
    ({"min_timestamp": "yesterday"}, "inputs.events.min_timestamp"),
    ({"max_timestamp": True}, "inputs.events.max_timestamp"),
    ({"max_timestamp": float("nan")}, "inputs.events.max_timestamp"),
    ({"min_timestamp": "2200-01-01", "max_timestamp": "1971-01-01"}, "inputs.events.min_timestamp"),
])
def test_bad_timestamp_options_are_config_errors_at_their_path(tmp_path: Path, options: dict, path: str) -> None:
    (tmp_path / "data").mkdir()
    with pytest.raises(ConfigError) as caught:
        open_input(_job(tmp_path, "jsonl", **options), "events")
    assert caught.value.problems[0].path == path


def test_bounds_take_dates_and_false(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    rule = open_input(_job(tmp_path, "jsonl", min_timestamp="2020-01-01", max_timestamp="2030-01-01T00:00:00+01:00"),
                      "events").timestamps
    assert (rule.minimum, rule.maximum) == (1_577_836_800.0, 1_893_452_400.0)
    unbounded = open_input(_job(tmp_path, "jsonl", min_timestamp=False, max_timestamp=False), "events").timestamps
    assert unbounded.seconds(-1e300) == -1e300 and unbounded.seconds(1e300) == 1e300
    for value in (math.nan, math.inf, True, "5"):
        with pytest.raises(BadTimestamp):
            unbounded.seconds(value)


@settings(max_examples=300)
@given(st.one_of(st.floats(), st.integers(-2**70, 2**70), st.booleans(), st.text(max_size=3), st.none()),
       st.sampled_from(["s", "ms", "us", "ns"]))
def test_the_rule_returns_only_finite_seconds_inside_its_bounds(value: Any, unit: str) -> None:
    rule = TimestampRule("x", unit)
    try:
        seconds = rule.seconds(value)
    except BadTimestamp as exc:
        assert exc.problem.error_type is TimestampError and exc.problem.hint
        return
    assert seconds is None if value is None else (
        math.isfinite(seconds) and DEFAULT_MIN_TIMESTAMP <= seconds <= DEFAULT_MAX_TIMESTAMP
        and not isinstance(value, (bool, str)))


def test_the_generator_outside_the_range_gives_bad_records(tmp_path: Path) -> None:
    job = parse_job_config({"job": {"name": "g", "partitions": 1, "task": "m:T"},
                            "inputs": {"early": {"system": "generator", "kind": "page_views", "events": 5,
                                                 "start_ts": -100}}}, base_dir=tmp_path)
    records = list(open_input(job, "early").read(0, 0, 5))
    assert all(r.error is not None and r.error.error_type is TimestampError for r in records)


def test_the_dataframe_step_refuses_a_nan_order_value_and_converts_its_unit() -> None:
    import pyarrow as pa

    from localstate.runtime.spark.dataframe import DataFrameSpec, _arrow_rows, _records

    rows = pa.table({"user": ["a", "b", "c"], "ts": [1.7e12, float("nan"), 1.7e12 + 5]})
    job = parse_job_config({"job": {"name": "d", "partitions": 1, "task": "m:T"}})
    spec = DataFrameSpec(job, "user", "dataframe", "ts", None, ("user", "ts"), "number", "StringType",
                         timestamp_rule("dataframe", {"timestamp_unit": "ms", "min_timestamp": None,
                                                      "max_timestamp": None}))
    records = [record for _, record in _records(spec, rows, 0)]
    assert [r.ts for r in records if r.error is None] == [1.7e9, 1.700000000005e9]
    assert records[1].error.error_type is TimestampError
    assert _arrow_rows(spec, rows, 0) is None  # a refused row: fed as records, that one a bad record
    fine = _arrow_rows(spec, rows.slice(0, 1), 0)
    assert fine[0].batch.column("timestamp").to_pylist() == [1.7e9]
    unbounded = DataFrameSpec(job, "user", "dataframe", "ts", None, ("user", "ts"), "number", "StringType", NO_BOUNDS)
    assert [r.ts for _, r in _records(unbounded, pa.table({"user": ["a"], "ts": [3]}), 0)] == [3.0]


@settings(max_examples=60, deadline=None)
@given(values=st.lists(st.one_of(st.none(), st.integers(-2**62, 2**62), st.just(-0.0),
                                 st.floats(allow_nan=True, allow_infinity=True)), max_size=30),
       unit=st.sampled_from(["s", "ms", "us", "ns"]),
       bounds=st.sampled_from([(None, None), (0.0, None), (DEFAULT_MIN_TIMESTAMP, DEFAULT_MAX_TIMESTAMP), (-5.0, 1e6)]),
       as_timestamps=st.booleans())
def test_the_dataframe_steps_column_check_gives_every_row_what_the_row_check_gives(
        values: list[Any], unit: str, bounds: tuple[Any, Any], as_timestamps: bool) -> None:
    """The per-record DataFrame step checks an order column whole and, when every value fits, gives
    each record its seconds as they are; each record (ts, or the bad record) is what checking the rows
    one by one gives."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from localstate.runtime.spark.dataframe import DataFrameSpec, _checked_record, _records

    if as_timestamps:
        column = pa.array([None if v is None or isinstance(v, float) else v % 2**50 for v in values],
                          pa.timestamp("us"))
        kind, per_second = "timestamp", 1e6
        times = pc.cast(pc.cast(column, "timestamp[us]"), "int64").to_pylist()
    else:
        column = pa.array([float(v) if isinstance(v, int) else v for v in values], pa.float64())
        kind, per_second = "number", None
        times = column.to_pylist()
    rows = pa.table({"user": [f"u{i}" for i in range(len(values))], "ts": column})
    job = parse_job_config({"job": {"name": "d", "partitions": 1, "task": "m:T"}})
    rule = timestamp_rule("dataframe", {"timestamp_unit": unit, "min_timestamp": bounds[0], "max_timestamp": bounds[1]})
    spec = DataFrameSpec(job, "user", "dataframe", "ts", "ts", ("user", "ts"), kind, "StringType", rule)
    got = [record for _, record in _records(spec, rows, 10)]
    one_by_one = [_checked_record(10 + i, f"u{i}", value, ts, rule, per_second)
                  for i, (value, ts) in enumerate(zip(column.to_pylist(), times))]
    # repr: -0.0 == 0.0, but each record's seconds must be the very value (0.0 for both zeros)
    assert repr([(r.offset, r.key, r.ts, r.error) for r in got]) == \
        repr([(r.offset, r.key, r.ts, r.error) for r in one_by_one])


class _Seen(StreamTask):
    def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
        collector.send("out", envelope.key, envelope.timestamp)


@pytest.mark.parametrize("stamp", [True, False, "5", [1], {"a": 1}, math.nan, math.inf, -math.inf, 10**400])
def test_the_driver_refuses_a_timestamp_of_the_wrong_type(stamp: Any) -> None:
    with TaskTestDriver(_Seen) as driver:
        with pytest.raises(TimestampError) as caught:
            driver.send("events", "k", 1, timestamp=stamp)
        assert caught.value.context["stream"] == "events"


def test_the_driver_applies_declared_units_and_bounds() -> None:
    with TaskTestDriver(_Seen, inputs={"clicks": {"on_error": "skip", "timestamp_unit": "ms",
                                                  "min_timestamp": "2020-01-01"}}) as driver:
        driver.send("clicks", "a", 1, timestamp=1_700_000_000_500)
        driver.send("clicks", "b", 1, timestamp=1_700_000_000)  # seconds declared as ms: 1970
        driver.send("events", "c", 1, timestamp=5.0)  # undeclared: any finite number
        driver.commit()
        assert driver.outputs("out") == [("a", 1_700_000_000.5), ("c", 5.0)]


def test_a_ttl_store_fed_milliseconds_opens_again_in_the_next_run(tmp_path: Path) -> None:
    """The bricked job of issue 43: an event-time ttl store fed 1.7e12 committed; the next run (a new
    driver on the same state) opens it, and its values are there."""
    class Seen(StreamTask):
        def init(self, context: Any) -> None:
            self.seen = context.kv("seen")

        def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
            self.seen.put(envelope.key, envelope.value)

    stores = {"seen": {"engine": "kv", "key_serde": "string", "value_serde": "json", "ttl": "1h",
                       "ttl_time": "event"}}
    for run in range(3):
        with TaskTestDriver(Seen, stores=stores, state_dir=tmp_path) as driver:
            driver.send("events", f"k{run}", run, timestamp=1.7e12 + run)
            driver.commit()
            assert {f"k{i}" for i in range(run + 1)} == {key for key, _ in driver.store("seen").all()}
