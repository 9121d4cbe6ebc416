"""The DataFrame step's Arrow-to-Python conversion of a per-record task's rows (``_pylist``,
``_row_values``): differential against pyarrow's own ``to_pylist``, the reference, on the column
types a Spark DataFrame hands Python (timestamps in UTC, in a zone with daylight saving time, at a
fixed offset and without a zone; dates), with nulls, several chunks and values at and beyond what
``datetime`` holds. Same values, same classes, same time zones."""

from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from localstate.runtime.spark.dataframe import _PY_DAYS, _PY_MICROS, _pylist, _row_values

ZONES = [None, "UTC", "Etc/UTC", "America/New_York", "Europe/London", "+05:30", "-08:00"]


def _same(ours: list, reference: list) -> None:
    assert ours == reference
    for mine, theirs in zip(ours, reference):
        assert type(mine) is type(theirs)
        tz = getattr(theirs, "tzinfo", None)
        if tz is not None:
            assert mine.tzinfo == tz and str(mine.tzinfo) == str(tz)
            assert mine.utcoffset() == theirs.utcoffset() and mine.fold == theirs.fold
            assert mine.isoformat() == theirs.isoformat()


_micros = st.one_of(st.integers(_PY_MICROS[0], _PY_MICROS[1]),
                    st.integers(-10**15, 10**15),  # around today, where zones change their offsets
                    st.sampled_from([_PY_MICROS[0], _PY_MICROS[1], 0, -1]))


@settings(max_examples=150, deadline=None)
@given(zone=st.sampled_from(ZONES), chunks=st.lists(st.lists(st.one_of(_micros, st.none()), max_size=30),
                                                    min_size=1, max_size=3))
def test_timestamps_as_pyarrow_gives_them(zone, chunks):
    column = pa.chunked_array([pa.array(chunk, pa.timestamp("us", tz=zone)) for chunk in chunks],
                              pa.timestamp("us", tz=zone))
    try:
        reference = column.to_pylist()
    except Exception as error:  # noqa: BLE001 - e.g. an offset taking a value past year 1: the same error
        with pytest.raises(type(error)):
            _pylist(column)
        return
    _same(_pylist(column), reference)


@settings(max_examples=60, deadline=None)
@given(days=st.lists(st.one_of(st.integers(_PY_DAYS[0], _PY_DAYS[1]), st.none()), max_size=40))
def test_dates_as_pyarrow_gives_them(days):
    column = pa.array(days, pa.date32())
    _same(_pylist(column), column.to_pylist())


@pytest.mark.parametrize("zone", ZONES)
def test_values_datetime_cannot_hold_behave_as_in_pyarrow(zone):
    """Beyond year 9999 pyarrow raises; so does the conversion (it hands such columns to pyarrow)."""
    column = pa.array([0, _PY_MICROS[1] + 1], pa.timestamp("us", tz=zone))
    with pytest.raises(Exception) as reference:
        column.to_pylist()
    with pytest.raises(type(reference.value)):
        _pylist(column)


def test_rows_as_dicts_match_arrow_rows():
    table = pa.table({"user": ["a", "b", None], "value": [b"x", None, b"z"],
                      "at": pa.array([1_700_000_000_000_000, 5, None], pa.timestamp("us", tz="UTC")),
                      "day": pa.array([19000, None, 1], pa.date32()),
                      "local": pa.array([1_699_999_999_000_000, 0, 7], pa.timestamp("us", tz="America/New_York")),
                      "n": [1, 2, 3]})
    rows = _row_values(table, table.column_names)
    reference = table.to_pylist()
    assert rows == reference
    for mine, theirs in zip(rows, reference):
        _same(list(mine.values()), list(theirs.values()))
