"""The examples written twice, per record and as a batch task (issue #35): over random batches
(key skew, repeated keys, rows of both inputs in one batch), commits and crashes, the batch task
gives exactly the per-record task's state and outputs. The Spark paths run them in
tests/spark/test_batch_examples_spark.py."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from localstate.testing.driver import TaskTestDriver

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
sys.path.insert(0, str(EXAMPLES / "stream_table_join"))
sys.path.insert(0, str(EXAMPLES / "dataframe"))
from counting import CountPerUser, CountPerUserBatch  # noqa: E402
from stream_table_join import EnrichWithZip, EnrichWithZipBatch  # noqa: E402

# Skewed users: "u0" is drawn about half the time, so batches repeat keys.
users = st.one_of(st.just("u0"), st.sampled_from([f"u{i}" for i in range(1, 8)]))
views = st.tuples(st.just("page_views"), users, st.builds(lambda n: {"page": f"/p{n}"}, st.integers(0, 3)))
profiles = st.tuples(st.just("profiles"), users, st.one_of(
    st.builds(lambda z: {"zip": z}, st.sampled_from(["10115", "75001", "94105"])),
    st.builds(lambda z: {"zip": z, "name": "x"}, st.sampled_from(["02139"]))))  # another shape of value
join_step = st.one_of(
    st.tuples(st.just("rows"), st.lists(st.one_of(views, profiles), max_size=30)),
    st.tuples(st.just("send"), st.one_of(views, profiles)),
    st.tuples(st.just("commit")),
    st.tuples(st.just("crash")),
)


def _drive(driver: TaskTestDriver, steps: list[tuple[Any, ...]]) -> None:
    clock = iter(range(10_000))
    for s in steps:
        if s[0] == "rows":
            driver.send_rows([(stream, key, value, float(next(clock))) for stream, key, value in s[1]])
        elif s[0] == "send":
            stream, key, value = s[1]
            driver.send(stream, key, value, timestamp=float(next(clock)))
        elif s[0] == "commit":
            driver.commit()
        else:
            driver.restart()  # the uncommitted rows are delivered again
    driver.commit()


def _state_and_outputs(task: Any, steps: list[tuple[Any, ...]], store: str, value_serde: str,
                       output: str) -> tuple[Any, ...]:
    """Drive ``task`` (2 partitions) through ``steps``; its kv ``store`` in each partition and its ``output``."""
    stores = {store: {"engine": "kv", "key_serde": "string", "value_serde": value_serde}}
    with TaskTestDriver(task, stores=stores, partitions=2) as driver:
        _drive(driver, steps)
        state = [sorted(driver.store(store, p).all()) for p in (0, 1)]
        return state, driver.outputs(output)


def _join(task: Any, steps: list[tuple[Any, ...]]) -> tuple[Any, ...]:
    return _state_and_outputs(task, steps, "profiles", "json", "enriched-views")


#: The Hypothesis settings both property tests run with
EXAMPLES_40 = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@EXAMPLES_40
@given(steps=st.lists(join_step, max_size=12))
def test_stream_table_join_batch_task_matches_the_per_record_task(steps: list[tuple[Any, ...]]) -> None:
    per_record = _join(EnrichWithZip, steps)
    batched = _join(EnrichWithZipBatch, steps)
    assert batched == per_record
    views_sent = sum(1 for s in steps if s[0] == "send" and s[1][0] == "page_views") + sum(
        1 for s in steps if s[0] == "rows" for row in s[1] if row[0] == "page_views")
    assert len(batched[1]) >= views_sent  # every view enriched (a crash may send some again)


count_step = st.one_of(
    st.tuples(st.just("rows"), st.lists(st.tuples(st.just("events"), users,
                                                  st.builds(lambda v: {"value": v}, st.integers(-5, 5))),
                                        max_size=40)),
    st.tuples(st.just("commit")),
    st.tuples(st.just("crash")),
)


def _count(task: Any, steps: list[tuple[Any, ...]]) -> tuple[Any, ...]:
    return _state_and_outputs(task, steps, "counts", "int", "counts")


@EXAMPLES_40
@given(steps=st.lists(count_step, max_size=10))
def test_counting_batch_task_matches_the_per_record_task(steps: list[tuple[Any, ...]]) -> None:
    assert _count(CountPerUserBatch, steps) == _count(CountPerUser, steps)
