"""Checkpoint files are validated field by field: a bad one is a typed CheckpointError naming the
file and the field, never a silently wrong offset (an offset of -5 would trim a store empty)."""

from __future__ import annotations

import json

import pytest

from localstate.core.checkpoint import Checkpoint, CheckpointStore
from localstate.errors import CheckpointError

GOOD = {"format": 1, "partition": 0, "generation": 3, "inputs": {"in": 7}, "changelogs": {"counts": 12},
        "outputs": {"out": 2}}


def _with(path: str, value):  # noqa: ANN001
    data = json.loads(json.dumps(GOOD))
    *parents, last = path.split(".")
    target = data
    for name in parents:
        target = target[name]
    if value is _DELETE:
        del target[last]
    else:
        target[last] = value
    return json.dumps(data)


_DELETE = object()


def test_good_checkpoint_round_trips() -> None:
    checkpoint = Checkpoint.from_json(json.dumps(GOOD), "0.json")
    assert checkpoint == Checkpoint(0, 3, {"in": 7}, {"counts": 12}, {"out": 2})
    assert Checkpoint.from_json(checkpoint.to_json(), "0.json") == checkpoint


def test_input_ids_round_trip_and_are_left_out_when_empty() -> None:
    """The identity of each input read (a Kafka topic's id) travels with the checkpoint; a checkpoint
    without any, as every one written before them, reads as having none and is written as before."""
    checkpoint = Checkpoint(0, 3, {"in": 7}, {}, {}, input_ids={"in": "01a21c94-8dc8-7c50-971b-97e62d5424dd"})
    assert Checkpoint.from_json(checkpoint.to_json(), "0.json") == checkpoint
    plain = Checkpoint.from_json(json.dumps(GOOD), "0.json")
    assert plain.input_ids == {} and "input_ids" not in json.loads(plain.to_json())


@pytest.mark.parametrize("path, value, field", [
    ("changelogs.counts", -5, "changelogs.counts"),
    ("inputs.in", -1, "inputs.in"),
    ("inputs.in", 1 << 63, "inputs.in"),
    ("changelogs.counts", 10 ** 40, "changelogs.counts"),
    ("outputs.out", -2, "outputs.out"),
    ("generation", -1, "generation"),
    ("partition", -1, "partition"),
    ("changelogs.counts", True, "changelogs.counts"),   # bool is not an int
    ("generation", False, "generation"),
    ("inputs.in", 7.0, "inputs.in"),
    ("inputs.in", "7", "inputs.in"),
    ("inputs.in", None, "inputs.in"),
    ("partition", "0", "partition"),
    ("inputs", [7], "inputs"),
    ("changelogs", None, "changelogs"),
    ("outputs", "x", "outputs"),
    ("format", 2, "format"),
    ("partition", _DELETE, "partition"),
    ("inputs", _DELETE, "inputs"),
    ("changelogs", _DELETE, "changelogs"),
    ("input_ids", {"in": 7}, "input_ids"),
    ("input_ids", ["in"], "input_ids"),
    ("input_ids", {"in": "x" * 201}, "input_ids"),
])
def test_bad_field_is_a_typed_error_naming_file_and_field(path: str, value, field: str) -> None:  # noqa: ANN001
    with pytest.raises(CheckpointError) as info:
        Checkpoint.from_json(_with(path, value), "/state/job/checkpoints/0.json")
    assert info.value.context["path"] == "/state/job/checkpoints/0.json"
    assert info.value.context["field"] == field
    assert "what to do" in str(info.value)


@pytest.mark.parametrize("text", ["", "not json", "[]", "7", "null", "[" * 100_000, '{"format": 1'])
def test_unparsable_checkpoint_is_a_typed_error(text: str) -> None:
    with pytest.raises(CheckpointError) as info:
        Checkpoint.from_json(text, "0.json")
    assert info.value.context["path"] == "0.json"


def test_store_refuses_checkpoint_of_another_partition(tmp_path) -> None:  # noqa: ANN001
    store = CheckpointStore(tmp_path)
    store.save(Checkpoint(1, 1, {"in": 1}, {}, {}))
    (tmp_path / "1.json").rename(tmp_path / "0.json")
    with pytest.raises(CheckpointError) as info:
        store.load(0)
    assert info.value.context["field"] == "partition"


def test_store_refuses_negative_changelog_offset_on_load(tmp_path) -> None:  # noqa: ANN001
    store = CheckpointStore(tmp_path)
    (tmp_path / "0.json").write_text(_with("changelogs.counts", -5))
    with pytest.raises(CheckpointError) as info:
        store.load(0)
    assert info.value.context["field"] == "changelogs.counts"
    assert "-5" in str(info.value)
