"""Every refusal of a savepoint, a start from one and a rescale is a typed error naming what is at
fault and saying what to do, and changes nothing: the job's state stays as it was, runnable."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from localstate.errors import (FencedError, InputError, InputLagError, PartitionCountError, RescaleError,
                               SavepointCorruptError, SavepointFormatError, SavepointMismatchError, StateExistsError)
from localstate.runtime.layout import read_epoch, resolve_epoch
from localstate.runtime.statedata.loader import LoadOptions, load_savepoint
from localstate.runtime.statedata.location import SavepointLocation
from localstate.runtime.statedata.manifest import MANIFEST
from localstate.runtime.statedata.reader import Savepoint
from localstate.runtime.statedata.rescale import rescale
from localstate.runtime.statedata.writer import take_savepoint

from rescale_model import ModelRun, committed_state, model_job

RECORDS = [(f"user-{i % 13}", i, float(i)) for i in range(40)]


def ran(root: Path, partitions: int = 2, **options) -> tuple:
    """The model job run over RECORDS (and closed): the job and its committed state."""
    job = model_job(root, partitions, **options)
    run = ModelRun(job)
    run.feed(RECORDS)
    now = run.close()
    return job, committed_state(job, now), now


def saved(root: Path, job) -> Savepoint:
    location = SavepointLocation({"url": str(root / "sp")})
    take_savepoint(job, location)
    return Savepoint.open(location)


def unchanged(job, state, now, run_on: bool = True) -> None:
    """The job is still at epoch 0 with the same committed state (and runs on)."""
    assert read_epoch(job).epoch == 0
    assert committed_state(job, now) == state
    if run_on:
        run = ModelRun(job, now=now)
        run.feed(RECORDS[:3])
        run.close()


def test_a_store_not_keyed_by_the_routing_key_is_refused_by_name_with_a_sample_key(tmp_path: Path) -> None:
    # "total" is one key per partition: without a redistribution it cannot be rescaled by key
    job, state, now = ran(tmp_path, stores={"total": {"engine": "kv", "backend": "memory", "key_serde": "string",
                                                      "value_serde": "int"}})
    with pytest.raises(RescaleError) as caught:
        rescale(resolve_epoch(job), 3)
    error = caught.value
    assert error.context["store"] == "total" and error.context["key"] == "'total'"
    assert "partition" in error.context and "rescale" in error.hint
    unchanged(job, state, now)


def test_a_merge_without_a_merge_function_is_refused(tmp_path: Path) -> None:
    job, state, now = ran(tmp_path, stores={"total": {"engine": "kv", "backend": "memory", "key_serde": "string",
                                                      "value_serde": "int", "rescale": "all"}})
    with pytest.raises(RescaleError) as caught:
        rescale(resolve_epoch(job), 3)
    assert caught.value.context["store"] == "total" and "rescale_merge" in caught.value.hint
    unchanged(job, state, now)


def test_a_timer_that_does_not_route_to_its_partition_is_refused_unless_copied(tmp_path: Path) -> None:
    job = model_job(tmp_path, 2)
    run = ModelRun(job)
    run.feed(RECORDS[:5])
    for partition in range(2):  # a per-partition timer of the task's own, not keyed by a record key
        run.driver.instances[partition].time.register_processing_time(f"flush-{partition}-x", 10_000.0)
    now = run.close()
    state = committed_state(job, now)
    with pytest.raises(RescaleError) as caught:
        rescale(resolve_epoch(job), 3)
    assert caught.value.context["store"] == "_timers" and "timer_rescale" in caught.value.hint
    unchanged(job, state, now, run_on=False)
    copied = model_job(tmp_path, 2, time={"timer_rescale": "all"})
    rescale(resolve_epoch(copied), 3)
    timers = committed_state(model_job(tmp_path, 3, time={"timer_rescale": "all"}), now)["_timers"]
    for partition in range(3):
        assert sum(b"flush-" in key for key, _ in timers[partition]) == 2  # both, in every new partition


def test_input_lag_in_the_old_partitions_is_refused_naming_input_partition_and_lag(tmp_path: Path) -> None:
    inputs = tmp_path / "in"
    inputs.mkdir()
    for partition in range(2):  # the input holds 25 records per partition; the job processed fewer
        (inputs / f"{partition}.jsonl").write_text("".join(json.dumps({"key": f"k{i}", "value": i}) + "\n"
                                                           for i in range(25)))
    job, state, now = ran(tmp_path, inputs={"events": {"system": "jsonl", "path": str(inputs)}})
    with pytest.raises(InputLagError) as caught:
        rescale(resolve_epoch(job), 3)
    error = caught.value
    assert error.context["input"] == "events" and error.context["partition"] in (0, 1) and error.context["lag"] > 0
    assert "--until-drained" in error.hint
    unchanged(job, state, now, run_on=False)
    # a savepoint taken before the job drained cannot start it with another partition count either
    savepoint = saved(tmp_path, job)
    with pytest.raises(InputLagError):
        load_savepoint(savepoint, model_job(tmp_path, 3, inputs={"events": {"system": "jsonl", "path": str(inputs)}}),
                       LoadOptions(yes=True))
    unchanged(job, state, now)


def test_a_savepoint_cut_short_truncated_or_altered_is_refused(tmp_path: Path) -> None:
    job, _, _ = ran(tmp_path)
    location = SavepointLocation({"url": str(tmp_path / "sp")})
    manifest = take_savepoint(job, location)
    root = tmp_path / "sp"
    data_file = root / sorted(manifest.files)[0]
    original = data_file.read_bytes()
    cases = {
        "altered": original[:-20] + bytes(b ^ 0xFF for b in original[-20:-10]) + original[-10:],
        "truncated": original[:len(original) // 2],
    }
    for what, damaged in cases.items():
        data_file.write_bytes(damaged)
        with pytest.raises(SavepointCorruptError, match="sha256" if what == "altered" else "bytes"):
            Savepoint.open(location)
    data_file.unlink()
    with pytest.raises(SavepointCorruptError, match="missing"):
        Savepoint.open(location)
    data_file.write_bytes(original)
    Savepoint.open(location)  # whole again
    (root / MANIFEST).unlink()  # a savepoint whose manifest was never written
    with pytest.raises(SavepointCorruptError, match="cut short"):
        Savepoint.open(location)


@pytest.mark.parametrize("text", ["{not json", "[]", '{"kind": "localstate-savepoint", "format": "1"}',
                                  '{"kind": "localstate-savepoint", "format": 1, "partitions": 0}',
                                  '{"kind": "localstate-savepoint", "format": 1, "partitions": 2, "job": "j", '
                                  '"stores": {}, "files": {"../x": {"sha256": "00", "bytes": 1, "rows": 1}}, '
                                  '"checkpoints": {"0": null, "1": null}}'])
def test_a_damaged_manifest_is_refused(tmp_path: Path, text: str) -> None:
    (tmp_path / MANIFEST).write_text(text)
    with pytest.raises(SavepointCorruptError):
        Savepoint.open(SavepointLocation({"url": str(tmp_path)}))


def test_a_savepoint_of_a_newer_format_is_refused(tmp_path: Path) -> None:
    job, _, _ = ran(tmp_path)
    savepoint = saved(tmp_path, job)
    path = tmp_path / "sp" / MANIFEST
    data = json.loads(path.read_text())
    data["format"] = 2
    path.write_text(json.dumps(data))
    with pytest.raises(SavepointFormatError) as caught:
        Savepoint.open(savepoint.location)
    assert caught.value.context["format"] == 2


def test_a_savepoint_of_another_job_is_refused_unless_asked_for(tmp_path: Path) -> None:
    job, _, now = ran(tmp_path / "a")
    savepoint = saved(tmp_path, job)
    other = model_job(tmp_path / "b", 2, name="other")
    with pytest.raises(SavepointMismatchError) as caught:
        load_savepoint(savepoint, other)
    assert caught.value.context["savepoint_job"] == "model" and "--other-job" in caught.value.hint
    load_savepoint(savepoint, other, LoadOptions(other_job=True))
    assert read_epoch(other).epoch == 1


def test_a_target_that_holds_state_is_not_replaced_without_yes(tmp_path: Path) -> None:
    job, state, now = ran(tmp_path)
    savepoint = saved(tmp_path, job)
    with pytest.raises(StateExistsError) as caught:
        load_savepoint(savepoint, model_job(tmp_path, 3))
    assert "--yes" in caught.value.hint
    unchanged(job, state, now, run_on=False)
    with pytest.raises(StateExistsError):  # nor is a savepoint location
        take_savepoint(job, savepoint.location)


def test_a_store_of_another_kind_or_layout_is_refused(tmp_path: Path) -> None:
    job, state, now = ran(tmp_path)
    savepoint = saved(tmp_path, job)
    no_ttl = model_job(tmp_path, 2, stores={"recent": {"engine": "kv", "backend": "memory", "key_serde": "string",
                                                       "value_serde": "int"}})
    with pytest.raises(SavepointMismatchError, match="layout"):
        load_savepoint(savepoint, no_ttl, LoadOptions(yes=True))
    heap = model_job(tmp_path, 2, stores={"counts": {"engine": "heap", "backend": "memory", "key_serde": "string"}})
    with pytest.raises(SavepointMismatchError, match="heap"):
        load_savepoint(savepoint, heap, LoadOptions(yes=True))
    unchanged(job, state, now)


def test_after_a_rescale_the_old_partition_count_and_a_stale_run_are_refused(tmp_path: Path) -> None:
    job, _, now = ran(tmp_path)
    old = resolve_epoch(job)
    rescale(old, 3)
    with pytest.raises(PartitionCountError) as caught:
        resolve_epoch(job)
    error = caught.value
    assert (error.job_partitions, error.state_partitions) == (2, 3) and "partitions = 3" in error.hint
    from localstate import TaskTestDriver
    from rescale_model import ModelTask
    with pytest.raises(FencedError):  # a config bound to the old epoch (a run started before) is fenced
        TaskTestDriver(ModelTask, job=old)


def test_an_input_still_read_where_it_was_before_the_rescale_is_refused(tmp_path: Path) -> None:
    from localstate.core.stream import open_input
    from localstate.runtime.layout import check_moved_inputs

    inputs = tmp_path / "in"
    inputs.mkdir()
    for partition in range(2):
        (inputs / f"{partition}.jsonl").write_text("")
    declared = {"clicks": {"system": "jsonl", "path": str(inputs)}}  # drained: empty, nothing read
    job, _, _ = ran(tmp_path, inputs=declared)
    rescale(resolve_epoch(job), 3)
    rescaled = resolve_epoch(model_job(tmp_path, 3, inputs=declared))
    with pytest.raises(InputError) as caught:
        check_moved_inputs(rescaled, {"clicks": open_input(rescaled, "clicks")})
    assert caught.value.context["input"] == "clicks" and "3 partitions" in caught.value.hint
    moved = tmp_path / "in-3"
    moved.mkdir()
    elsewhere = resolve_epoch(model_job(tmp_path, 3, inputs={"clicks": {"system": "jsonl", "path": str(moved)}}))
    check_moved_inputs(elsewhere, {"clicks": open_input(elsewhere, "clicks")})
