"""Window parameters that cannot work are refused (issue 43 item 2): a size, hop or gap under
``MIN_WINDOW_SECONDS`` (1 ms), whose windows cannot be told apart in float seconds and never close,
and a hop that puts a record in more than ``MAX_WINDOWS_PER_RECORD`` (10,000) windows. At the bounds
every window a record belongs to is found again by its timer, over the whole default range of
plausible event times (the epoch to 2200), and the operator emits and deletes every one of them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from localstate.core.config import parse_job_config
from localstate.core.event_time import DEFAULT_MAX_TIMESTAMP, DEFAULT_MIN_TIMESTAMP
from localstate.core.task import StreamTask
from localstate.errors import ConfigError
from localstate.testing.driver import TaskTestDriver
from localstate.windows import Hopping, Session, Tumbling, WindowedAggregation, count
from localstate.windows.kinds import MAX_WINDOWS_PER_RECORD, MIN_WINDOW_SECONDS


@pytest.mark.parametrize(("make", "where"), [
    (lambda: Tumbling(0.000999), "window.size"),
    (lambda: Tumbling("0.5ms"), "window.size"),
    (lambda: Tumbling(1e-300), "window.size"),
    (lambda: Tumbling(5e-324), "window.size"),
    (lambda: Hopping(1, 0.0009), "window.advance"),
    (lambda: Hopping(0.0001, 0.0001), "window.size"),
    (lambda: Hopping("1h", "0.3599s"), "window.advance"),     # 10,003 windows a record
    (lambda: Hopping("1h", "1ms"), "window.advance"),         # 3.6 million: one record took 56 s
    (lambda: Hopping(10.001, 0.001), "window.advance"),       # 10,001
    (lambda: Hopping(1e10, 1), "window.advance"),
    (lambda: Session(0.0005), "window.gap"),
    (lambda: Session(1e-12), "window.gap"),
])
def test_windows_past_the_bounds_are_config_errors_naming_the_parameter(make: Any, where: str) -> None:
    with pytest.raises(ConfigError) as caught:
        make()
    assert caught.value.problems[0].path == where
    assert caught.value.hint


@pytest.mark.parametrize("make", [
    lambda: Tumbling("1ms"), lambda: Tumbling(MIN_WINDOW_SECONDS), lambda: Hopping(10, 0.001),
    lambda: Hopping("1h", "0.36s"), lambda: Hopping(MIN_WINDOW_SECONDS * 3, MIN_WINDOW_SECONDS),
    lambda: Session("1ms"), lambda: Tumbling(1e10),
])
def test_windows_at_the_bounds_are_accepted(make: Any) -> None:
    make()


plausible = st.floats(min_value=DEFAULT_MIN_TIMESTAMP, max_value=DEFAULT_MAX_TIMESTAMP)


@settings(max_examples=150, deadline=None)
@given(ts=plausible, advance=st.sampled_from([MIN_WINDOW_SECONDS, 0.0015, 0.01, 0.36, 1.0, 7.0]),
       hops=st.sampled_from([1, 2, 3, 7, 10, 100]), offset=st.sampled_from([0.0, 0.0005, 17.0]),
       lateness=st.sampled_from([0.0, 0.001, 60.0]), skew=st.sampled_from([1.0, 1.5, 0.999]))
def test_every_window_at_the_bounds_is_found_again_by_its_timer(ts: float, advance: float, hops: int, offset: float,
                                                                 lateness: float, skew: float) -> None:
    size = max(advance, advance * hops * skew)  # whole and fractional hops
    kind = Hopping(size, advance, offset)
    found = list(kind.indexes(ts))
    assert 1 <= len(found) <= MAX_WINDOWS_PER_RECORD
    for index in found:
        window = kind.window(index)
        assert window.start <= ts < window.end
        assert kind.index_closing_at(window.end + lateness, lateness) == index


@settings(max_examples=100, deadline=None)
@given(ts=plausible)
def test_the_most_windows_a_record_may_have_are_each_found_again(ts: float) -> None:
    kind = Hopping(10, 0.001)
    found = list(kind.indexes(ts))
    assert len(found) == MAX_WINDOWS_PER_RECORD
    assert all(kind.index_closing_at(kind.window(i).end, 0.0) == i for i in found[:: 997] + found[-1:])


class _Counts(StreamTask):
    KIND: Any = Tumbling("1ms")

    def init(self, context: Any) -> None:
        self.windows = WindowedAggregation(context, self.KIND, count(), store="windows", output="out")

    def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
        self.windows.add(envelope.key, envelope.value, envelope.timestamp, collector)

    def on_timer(self, key: Any, timestamp: float, collector: Any, coordinator: Any) -> None:
        assert self.windows.on_timer(key, timestamp, collector), (key, timestamp)


def _driver(tmp_path: Path, task: type[StreamTask]) -> TaskTestDriver:
    job = parse_job_config({
        "job": {"name": "bounds", "partitions": 1, "task": "unused:Unused", "state_dir": str(tmp_path),
                "commit_interval": 10 ** 9},
        "time": {"timers": True},
        "stores": {"windows": {"engine": "kv", "backend": "memory", "key_serde": "string", "value_serde": "int"}},
        "changelogs": {"file": {}}}, base_dir=tmp_path)
    return TaskTestDriver(task, job=job)


@pytest.mark.parametrize("ts", [DEFAULT_MIN_TIMESTAMP + 0.0004, 1.7e9 + 0.0005, DEFAULT_MAX_TIMESTAMP - 0.0011])
def test_one_millisecond_windows_close_across_the_plausible_range(tmp_path: Path, ts: float) -> None:
    with _driver(tmp_path, _Counts) as driver:
        for i in range(5):
            driver.send("events", "k", 1, timestamp=ts + i * 0.0004)
        driver.advance_event_time(ts + 1.0)
        driver.commit()
        sent = driver.outputs("out")
        assert sum(value["value"] for _, value in sent) == 5
        assert all(value["end"] - value["start"] == pytest.approx(0.001, abs=1e-5) for _, value in sent)
        assert list(driver.store("windows").all()) == []  # every window closed and deleted


def test_a_record_in_the_most_windows_allowed_is_counted_in_each_and_every_one_closes(tmp_path: Path) -> None:
    class Hops(_Counts):
        KIND = Hopping(10, 0.001)

    with _driver(tmp_path, Hops) as driver:
        driver.send("events", "k", 1, timestamp=1.7e9 + 0.0005)
        assert sum(1 for _ in driver.store("windows").all()) == MAX_WINDOWS_PER_RECORD
        driver.advance_event_time(1.7e9 + 11)
        driver.commit()
        sent = driver.outputs("out")
        assert len(sent) == MAX_WINDOWS_PER_RECORD and all(value["value"] == 1 for _, value in sent)
        assert list(driver.store("windows").all()) == []
