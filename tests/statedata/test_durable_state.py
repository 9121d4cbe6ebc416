"""The committed state read in place (DurableState), what a rescale starts from: it holds what a
savepoint of the job holds, it refuses state that moved on after it was opened, and a rescale from it
equals a rescale by a kept savepoint."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from localstate.errors import FencedError
from localstate.runtime.layout import resolve_epoch
from localstate.runtime.statedata.durable import DurableState
from localstate.runtime.statedata.location import SavepointLocation
from localstate.runtime.statedata.reader import Savepoint
from localstate.runtime.statedata.rescale import rescale
from localstate.runtime.statedata.writer import take_savepoint

from rescale_model import ModelRun, committed_state, model_job

RECORDS = [(f"user-{i % 13}", i, float(i % 90)) for i in range(60)]
KEYS = st.sampled_from([f"user-{i}" for i in range(12)] + ["", "ü", "a|b"])
RANDOM_RECORDS = st.lists(st.tuples(KEYS, st.integers(0, 50), st.floats(0, 99, allow_nan=False)), max_size=25)


def ran(root: Path, partitions: int, records: list) -> float:
    """The model job run over ``records`` on ``partitions`` (committed, stopped); returns its clock."""
    run = ModelRun(model_job(root, partitions))
    run.feed(records)
    run.event_time(50.0)
    return run.close()


def test_the_committed_state_read_in_place_holds_what_a_savepoint_of_it_holds(tmp_path: Path) -> None:
    ran(tmp_path, 2, RECORDS)
    job = resolve_epoch(model_job(tmp_path, 2))
    location = SavepointLocation({"url": str(tmp_path / "savepoint")})
    take_savepoint(job, location)
    saved, durable = Savepoint.open(location), DurableState.open(job)
    left, right = saved.manifest, durable.manifest
    assert (right.job, right.partitions, right.epoch, right.partitioner, right.timer_key_serde, right.checkpoints,
            right.inputs, right.changelog_system) == \
           (left.job, left.partitions, left.epoch, left.partitioner, left.timer_key_serde, left.checkpoints,
            left.inputs, left.changelog_system)
    assert right.files == {}
    assert sorted(right.stores) == sorted(left.stores)
    for name, entry in left.stores.items():
        found = right.stores[name]
        assert (found.engine, found.options, found.key_serde, found.value_serde, found.state_format) == \
               (entry.engine, entry.options, entry.key_serde, entry.value_serde, entry.state_format)
        for partition in range(2):
            assert durable.entries(name, partition) == saved.entries(name, partition)
    assert any(durable.entries("counts", partition) for partition in range(2))
    assert "model" in durable.where() and "epoch 0" in durable.where()


def test_state_that_moved_on_after_it_was_opened_is_refused(tmp_path: Path) -> None:
    now = ran(tmp_path, 2, RECORDS)
    durable = DurableState.open(resolve_epoch(model_job(tmp_path, 2)))
    run = ModelRun(model_job(tmp_path, 2), now=now)  # a run the caller should have kept out
    run.feed(RECORDS[:30])
    run.close()
    with pytest.raises(FencedError, match="committed a new checkpoint") as caught:
        for partition in range(2):
            list(durable.records("counts", partition))
    assert caught.value.context["job"] == "model"


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(first=RANDOM_RECORDS, second=RANDOM_RECORDS, old=st.integers(1, 4), new=st.integers(1, 5))
def test_a_rescale_from_the_state_in_place_equals_one_by_a_kept_savepoint(tmp_path_factory, first, second, old,
                                                                           new) -> None:
    if old == new:
        new = old + 1
    in_place = tmp_path_factory.mktemp("in-place")
    now = ran(in_place, old, first)
    by_savepoint = tmp_path_factory.mktemp("by-savepoint")
    shutil.copytree(in_place, by_savepoint, dirs_exist_ok=True)
    rescale(resolve_epoch(model_job(in_place, old)), new)
    rescale(resolve_epoch(model_job(by_savepoint, old)), new,
            savepoint_to=SavepointLocation({"url": str(by_savepoint / "kept")}))
    assert committed_state(model_job(in_place, new), now) == committed_state(model_job(by_savepoint, new), now)
    runs = [ModelRun(model_job(root, new), now=now) for root in (in_place, by_savepoint)]
    for run in runs:  # and both run on alike: timers and windows moved with their keys
        run.feed(second)
        run.event_time(500.0)
    assert runs[0].state() == runs[1].state()
    assert runs[0].outputs() == runs[1].outputs()
    clocks = [run.close() for run in runs]
    assert committed_state(model_job(in_place, new), clocks[0]) == \
           committed_state(model_job(by_savepoint, new), clocks[1])
