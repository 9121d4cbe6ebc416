"""Window assignment against brute force, and the windows' bad options (no stores, no runtime)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from localstate.errors import ConfigError
from localstate.windows import Hopping, Session, Tumbling, Window
from localstate.windows.kinds import overlaps

timestamps = st.floats(min_value=-1e6, max_value=2e9, allow_nan=False, allow_infinity=False)
sizes = st.sampled_from([0.1, 0.25, 1.0, 3.0, 7.5, 60.0, 3600.0])


@settings(max_examples=300, deadline=None)
@given(ts=timestamps, size=sizes, offset=st.sampled_from([0.0, 0.05, 1.5, 30.0]))
def test_a_record_is_in_exactly_its_one_tumbling_window(ts: float, size: float, offset: float) -> None:
    kind = Tumbling(size, offset)
    (index,) = kind.indexes(ts)
    window = kind.window(index)
    assert window.start <= ts < window.end
    assert not kind.window(index - 1).start <= ts < kind.window(index - 1).end
    assert not kind.window(index + 1).start <= ts < kind.window(index + 1).end


@settings(max_examples=300, deadline=None)
@given(ts=timestamps, size=sizes, hops=st.integers(min_value=1, max_value=6), offset=st.sampled_from([0.0, 0.5]))
def test_hopping_windows_are_every_window_holding_the_record(ts: float, size: float, hops: int, offset: float) -> None:
    kind = Hopping(size, size / hops, offset)
    found = list(kind.indexes(ts))
    assert found, "every record belongs to a hopping window"
    # Brute force: the windows around them, by their bounds.
    around = range(found[0] - hops - 2, found[-1] + hops + 3)
    assert found == [i for i in around if kind.window(i).start <= ts < kind.window(i).end]
    assert len(found) == hops


@settings(max_examples=200, deadline=None)
@given(ts=timestamps, size=sizes, hops=st.integers(min_value=1, max_value=6), lateness=st.sampled_from([0.0, 0.3, 60.0]))
def test_the_timer_of_a_window_finds_the_window_again(ts: float, size: float, hops: int, lateness: float) -> None:
    kind = Hopping(size, size / hops)
    for index in kind.indexes(ts):
        assert kind.index_closing_at(kind.window(index).end + lateness, lateness) == index


def test_windows_are_half_open() -> None:
    kind = Tumbling("1h")
    assert kind.window(kind.indexes(7200.0)[0]) == Window(7200.0, 10800.0)
    assert kind.window(kind.indexes(7199.5)[0]) == Window(3600.0, 7200.0)
    hopping = Hopping(10, 5)
    assert [hopping.window(i) for i in hopping.indexes(10.0)] == [Window(5.0, 15.0), Window(10.0, 20.0)]


def test_sessions_merge_when_they_overlap_or_touch() -> None:
    gap = Session("30s")
    assert gap.window(100.0) == Window(100.0, 130.0)
    assert overlaps((100.0, 130.0), (130.0, 160.0))
    assert not overlaps((100.0, 130.0), (130.5, 160.5))


@pytest.mark.parametrize(("make", "where"), [
    (lambda: Tumbling(0), "window.size"),
    (lambda: Tumbling("-5s"), "window.size"),
    (lambda: Tumbling("soon"), "window.size"),
    (lambda: Hopping(10, 20), "window.advance"),
    (lambda: Session(0), "window.gap"),
])
def test_bad_window_options_are_config_errors_naming_the_option(make, where: str) -> None:
    with pytest.raises(ConfigError) as caught:
        make()
    assert caught.value.problems[0].path == where
