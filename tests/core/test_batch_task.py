"""BatchTask on the in-process runtime (TaskTestDriver): the batch a task receives, the same state and
outputs as the per-record task over random batches (crashes included), bad input in a batch (on_error
per row), positions past whole batches, commits never splitting a batch."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from localstate import BatchTask, StreamTask
from localstate.core.stream import InputRecord
from localstate.core.task import Collector, Coordinator, TaskContext, load_task_class
from localstate.errors import InputError, TaskError
from localstate.testing.driver import TaskTestDriver

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "spark"))
from count_task import CountByKey, CountByKeyBatch  # noqa: E402

STORES = {"counts": {"engine": "kv", "key_serde": "string", "value_serde": "int"}}


class Recorder(BatchTask):
    """Keeps every batch it receives (in a class list: instances are recreated on restart)."""

    seen: list[pa.RecordBatch] = []

    def process_batch(self, batch: pa.RecordBatch, collector: Collector, coordinator: Coordinator) -> None:
        Recorder.seen.append(batch)
        collector.send_batch("echo", batch.column("key"), batch.column("offset"))


def test_a_batch_has_the_documented_columns() -> None:
    Recorder.seen = []
    with TaskTestDriver(Recorder) as driver:
        driver.send("events", "a", {"n": 1}, timestamp=5.0)
        driver.send_batch("events", ["b", "c", "d"], [{"n": 2}, {"n": 3}, {"n": 4}], timestamps=[6.0, None, 7.0])
        driver.commit()
        assert driver.outputs("echo") == [("a", 0), ("b", 1), ("c", 2), ("d", 3)]
    one, three = Recorder.seen
    assert one.schema.names == ["key", "value", "timestamp", "offset"]
    assert one.num_rows == 1 and one.to_pylist() == [{"key": "a", "value": {"n": 1}, "timestamp": 5.0, "offset": 0}]
    assert one.schema.metadata == {b"localstate.stream": b"events"}
    assert three.column("timestamp").to_pylist() == [6.0, None, 7.0]
    assert three.column("value").type == pa.struct([("n", pa.int64())])


def test_values_arrow_cannot_type_arrive_as_json_text() -> None:
    Recorder.seen = []
    with TaskTestDriver(Recorder) as driver:
        driver.send_batch("events", ["a", "b"], [1, "x"])
    [batch] = Recorder.seen
    assert batch.column("value").to_pylist() == ["1", '"x"']
    assert batch.schema.field("value").metadata == {b"localstate.encoding": b"json"}


def test_load_task_class_accepts_a_batch_task() -> None:
    assert load_task_class(CountByKeyBatch) is CountByKeyBatch
    assert load_task_class("count_task:CountByKeyBatch") is CountByKeyBatch
    assert issubclass(CountByKeyBatch, StreamTask)


# -- the batch task gives the per-record task's state and outputs --------------------------------------------

keys = st.sampled_from(["a", "b", "c", "d", "e", "f"])
step = st.one_of(
    st.tuples(st.just("send"), keys),
    st.tuples(st.just("batch"), st.lists(st.one_of(keys, st.just("a")), max_size=40)),
    st.tuples(st.just("commit")),
    st.tuples(st.just("crash")),
)


def _run(task: Any, steps: list[tuple[Any, ...]]) -> tuple[dict[str, int], list[tuple[Any, Any]]]:
    with TaskTestDriver(task, stores=STORES, partitions=2) as driver:
        for s in steps:
            if s[0] == "send":
                driver.send("events", s[1], None)
            elif s[0] == "batch":
                driver.send_batch("events", s[1], [None] * len(s[1]))
            elif s[0] == "commit":
                driver.commit()
            else:
                driver.restart()   # the uncommitted records are re-delivered
        driver.commit()
        state = {k: v for p in (0, 1) for k, v in driver.store("counts", p).all()}
        outputs = sorted(driver.outputs("counts-out"), key=lambda kv: (kv[0], kv[1]))
    return state, outputs


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=st.lists(step, max_size=15))
def test_batch_task_matches_the_per_record_task(steps: list[tuple[Any, ...]]) -> None:
    per_record = _run(CountByKey, steps)
    batched = _run(CountByKeyBatch, steps)
    assert batched == per_record
    # every record counted exactly once, whatever the crashes
    sent = [k for s in steps if s[0] == "send" for k in [s[1]]] + [k for s in steps if s[0] == "batch" for k in s[1]]
    assert sum(batched[0].values()) == len(sent)


# -- bad input, positions, commits -----------------------------------------------------------------------------

def _records(*items: Any) -> list[InputRecord]:
    return [InputRecord(0, None, None, None, error, raw) if error else InputRecord(0, key, None, 1.0)
            for key, error, raw in items]


@pytest.mark.parametrize("policy", ["skip", "dead_letter"])
def test_bad_rows_get_on_error_and_the_rest_of_the_batch_is_delivered(policy: str) -> None:
    inputs = {"events": {"on_error": policy, **({"dead_letter": "bad"} if policy == "dead_letter" else {})}}
    with TaskTestDriver(CountByKeyBatch, stores=STORES, inputs=inputs) as driver:
        driver.feed("events", _records(("a", None, None), (None, "invalid JSON", "{x"), ("a", None, None),
                                       ("b", None, None)))
        assert driver.instances[0].position("events") == 4   # past the whole batch, bad row included
        driver.commit()
        assert dict(driver.store("counts").all()) == {"a": 2, "b": 1}
        assert driver.outputs("counts-out") == [("a", 1), ("a", 2), ("b", 1)]
        dead = driver.outputs("bad") if policy == "dead_letter" else []
    if policy == "dead_letter":
        assert dead == [(None, {"stream": "events", "partition": 0, "offset": 1, "error": "invalid JSON",
                                "raw": "{x"})]


def test_a_bad_row_with_on_error_fail_fails_the_whole_batch() -> None:
    with TaskTestDriver(CountByKeyBatch, stores=STORES) as driver:
        with pytest.raises(InputError) as info:
            driver.feed("events", _records(("a", None, None), (None, "invalid JSON", "{x")))
        assert info.value.context["offset"] == 1
        assert driver.instances[0].position("events") == 0   # nothing of the batch was delivered
        assert driver.store("counts").get("a") is None


class Failing(BatchTask):
    def process_batch(self, batch: pa.RecordBatch, collector: Collector, coordinator: Coordinator) -> None:
        if batch.num_rows > 1:
            raise ValueError("boom")


def test_a_failing_batch_names_the_call_and_its_first_row() -> None:
    with TaskTestDriver(Failing) as driver:
        driver.send("events", "a", 1)
        with pytest.raises(TaskError) as info:
            driver.send_batch("events", ["b", "c"], [2, 3])
        assert "process_batch()" in info.value.message and "boom" in info.value.message
        assert info.value.context["offset"] == 1 and info.value.context["rows"] == 2


class CommitAsker(BatchTask):
    def init(self, context: TaskContext) -> None:
        self.counts = context.store("counts")

    def process_batch(self, batch: pa.RecordBatch, collector: Collector, coordinator: Coordinator) -> None:
        self.counts.merge_many(batch.column("key").to_pylist(), [1] * batch.num_rows)
        coordinator.commit()


def test_a_commit_never_splits_a_batch() -> None:
    with TaskTestDriver(CommitAsker, stores=STORES, commit_every=2) as driver:
        driver.send_batch("events", list("abcde"), [None] * 5)
        instance = driver.instances[0]
        assert instance.commits == 1   # one commit after the whole batch, not one per two records
        checkpoint = instance.checkpoints.load(0)
        assert checkpoint.inputs == {"events": 5}


# -- the columns hold exactly the values a per-record task gets ----------------------------------------------

_json_scalars = st.one_of(st.none(), st.booleans(), st.integers(-2 ** 70, 2 ** 70), st.floats(allow_nan=False),
                          st.text(max_size=5))
_json_values = st.recursive(_json_scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.sampled_from(["a", "b", "c"]), inner, max_size=3)), max_leaves=6)


@settings(max_examples=300, deadline=None)
@given(values=st.one_of(st.lists(_json_values, min_size=1, max_size=8),
                        st.lists(st.fixed_dictionaries({"page": st.text(max_size=3), "n": st.integers(0, 9)}),
                                 min_size=1, max_size=8)))
def test_record_batch_columns_read_back_as_the_values_given(values: list[Any]) -> None:
    from localstate import column_values
    from localstate.core.task import record_batch

    n = len(values)
    batch = record_batch(["s"], list(range(n)), values, values, [None] * n)
    for name in ("key", "value"):
        # repr: 1 and 1.0, True and 1, key order all count
        assert repr(column_values(batch, name)) == repr(values)
