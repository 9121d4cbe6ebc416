"""A file-log input with a damaged record in the middle (records a, b (damaged), c, d) used to stop
silently at the damage: ``end_offset`` said 1, c and d were never read, on every run. Damage followed
by valid records is now a typed InputError naming the stream, partition, offset and segment,
whatever on_error says (a damaged frame hides an unknown number of records). A torn tail (an append
cut short, nothing valid after it) is still just the end of the data."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from localstate.changelog.file import FileChangelogSystem
from localstate.changelog.framing import HEADER_SIZE
from localstate.changelog.file.format import list_segments, segment_name
from localstate.core.config import parse_job_config
from localstate.core.stream import open_input
from localstate.errors import InputError

RECORDS = [(b'"a"', b"1"), (b'"b"', b"2"), (b'"c"', b"3"), (b'"d"', b"4")]


def _write(root: Path, records: list[tuple[bytes, bytes]], segment_bytes: int | None = None) -> Path:
    options = {"path": str(root)}
    if segment_bytes:
        options["segment_bytes"] = segment_bytes
    system = FileChangelogSystem(options, root)
    system.ensure_stream("events", 1)
    writer = system.partition("events", 0)
    for key, value in records:
        writer.append(key, value)
        writer.flush()
    writer.close()
    return system.partition_dir("events", 0)


def _input(tmp_path: Path, on_error: str = "fail"):  # noqa: ANN202
    job = parse_job_config({"job": {"name": "j", "partitions": 1, "task": "x:Y"},
                            "inputs": {"events": {"system": "file", "path": str(tmp_path / "data"),
                                                  "on_error": on_error}}}, base_dir=tmp_path)
    return open_input(job, "events")


def _record_position(directory: Path, index: int) -> tuple[Path, int]:
    path = directory / segment_name(list_segments(directory)[0])
    size = HEADER_SIZE + 3 + 1  # every record here: 3-byte key, 1-byte value
    return path, index * size


def _patch(path: Path, position: int, data: bytes) -> None:
    with open(path, "r+b") as handle:
        handle.seek(position)
        handle.write(data)


@pytest.mark.parametrize("on_error", ["fail", "skip"])
@pytest.mark.parametrize("field_at, data", [
    (20, struct.pack("<I", 1000)),     # klen of b: the record looks incomplete
    (24, struct.pack("<i", 7)),        # vlen of b
    (24, struct.pack("<i", -9)),       # vlen of b: impossible
    (0, b"\0\0\0\0"),                  # crc of b
    (HEADER_SIZE + 1, b"X"),           # a key byte of b
])
def test_damaged_record_in_the_middle_is_a_typed_error(tmp_path: Path, on_error: str, field_at: int,
                                                       data: bytes) -> None:
    directory = _write(tmp_path / "data", RECORDS)
    path, position = _record_position(directory, 1)
    _patch(path, position + field_at, data)
    source = _input(tmp_path, on_error)
    with pytest.raises(InputError) as info:
        source.end_offset(0)
    context = info.value.context
    assert (context["stream"], context["partition"], context["offset"]) == ("events", 0, 1)
    assert context["segment"] == str(path)
    assert "what to do" in str(info.value)
    # reading what precedes the damage still works; reading across it is the same typed error
    assert [r.key for r in source.read(0, 0, 1)] == ["a"]
    with pytest.raises(InputError) as info:
        list(source.read(0, 0, 4))
    assert info.value.context["offset"] == 1


def test_damage_in_a_sealed_segment_is_a_typed_error_when_read(tmp_path: Path) -> None:
    directory = _write(tmp_path / "data", RECORDS * 3, segment_bytes=3 * (HEADER_SIZE + 4))
    assert len(list_segments(directory)) > 2
    path, position = _record_position(directory, 1)
    _patch(path, position + 24, struct.pack("<i", 7))
    source = _input(tmp_path)
    end = source.end_offset(0)
    assert end == 12  # the last segment is intact
    with pytest.raises(InputError) as info:
        list(source.read(0, 0, end))
    assert info.value.context["stream"] == "events" and info.value.context["offset"] == 1


def test_torn_tail_is_the_end_of_the_data_not_an_error(tmp_path: Path) -> None:
    directory = _write(tmp_path / "data", RECORDS)
    path, position = _record_position(directory, 3)
    with open(path, "r+b") as handle:
        handle.truncate(position + 10)  # d was cut short
    source = _input(tmp_path)
    assert source.end_offset(0) == 3
    assert [r.key for r in source.read(0, 0, 3)] == ["a", "b", "c"]


def test_end_offset_follows_appends_and_finds_later_damage(tmp_path: Path) -> None:
    directory = _write(tmp_path / "data", RECORDS[:2])
    source = _input(tmp_path)
    assert source.end_offset(0) == 2
    system = FileChangelogSystem({"path": str(tmp_path / "data")}, tmp_path)
    writer = system.partition("events", 0)
    for key, value in RECORDS[2:] + RECORDS:
        writer.append(key, value)
    writer.flush()
    writer.close()
    assert source.end_offset(0) == 8
    path, position = _record_position(directory, 5)
    _patch(path, position + 20, struct.pack("<I", 1000))
    fresh = _input(tmp_path)
    with pytest.raises(InputError) as info:
        fresh.end_offset(0)
    assert info.value.context["offset"] == 5
