"""``max_records_per_trigger`` of the ``localstate-kafka`` streaming source: how a micro-batch's
records are shared among the partitions (the planning function, over many hostile lags)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from localstate.runtime.spark.kafka_source import _limited

partition_lags = st.dictionaries(st.integers(0, 7), st.tuples(st.integers(0, 2**40), st.integers(0, 10_000)),
                                 max_size=8)


@settings(max_examples=300, deadline=None)
@given(partitions=partition_lags, most=st.integers(0, 20_000))
def test_a_limited_batch_takes_at_most_the_limit_in_proportion_to_the_lags(partitions, most) -> None:
    start = {p: first for p, (first, _) in partitions.items()}
    end = {p: first + lag for p, (first, lag) in partitions.items()}
    limited = _limited(start, end, most)
    assert limited.keys() == end.keys()
    taken = {p: limited[p] - start[p] for p in end}
    lags = {p: end[p] - start[p] for p in end}
    assert all(0 <= taken[p] <= lags[p] for p in end)  # never backwards, never past the end
    total = sum(lags.values())
    if total <= most:
        assert limited == end  # everything fits: read everything
    else:
        assert sum(taken.values()) == max(1, most)  # a full batch (and always some progress)
        for p in end:  # each partition's share is its proportion, rounded one way or the other
            assert abs(taken[p] - lags[p] * max(1, most) / total) < 1 + 1e-9
    assert _limited(start, end, most) == limited  # the same plan every time (a re-planned batch)


def test_partitions_missing_from_the_start_read_from_offset_zero() -> None:
    assert _limited({}, {0: 10, 1: 30}, 8) == {0: 2, 1: 6}
    assert _limited({0: 10}, {0: 10, 1: 30}, 8) == {0: 10, 1: 8}
