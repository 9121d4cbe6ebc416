"""Torn tails are truncated with a warning; corruption anywhere else is an error, never skipped."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from localstate.changelog.file import FileChangelogSystem
from localstate.changelog.file.format import list_segments, segment_name
from localstate.errors import ChangelogCorruptError


def write(system: FileChangelogSystem, n: int, stream: str = "s") -> list[tuple[bytes, bytes | None]]:
    part = system.partition(stream, 0)
    items = [(b"key%03d" % i, None if i % 5 == 4 else b"value-%d" % i * 3) for i in range(n)]
    part.append_many(items)
    part.flush()
    part.close()
    return items


def last_segment(system: FileChangelogSystem, stream: str = "s") -> Path:
    directory = system.partition_dir(stream, 0)
    return directory / segment_name(list_segments(directory)[-1])


@pytest.mark.parametrize("cut", [1, 5, 27, 28, 29, 33, -1])
def test_torn_tail_truncated_with_warning(system: FileChangelogSystem, caplog: pytest.LogCaptureFixture,
                                          cut: int) -> None:
    items = write(system, 10)
    path = last_segment(system)
    size = path.stat().st_size
    last_len = 28 + len(items[-1][0]) + len(items[-1][1] or b"")
    record_start = size - last_len
    keep = record_start + (cut if cut > 0 else last_len + cut)
    os.truncate(path, keep)
    with caplog.at_level(logging.WARNING):
        part = system.partition("s", 0)
    # localstate's own: a Kafka client an earlier test on this worker left retrying logs warnings too
    warnings = [r.getMessage() for r in caplog.records
                if r.levelno == logging.WARNING and r.name.startswith("localstate")]
    assert len(warnings) == 1
    assert "s partition 0" in warnings[0] and "offset 9" in warnings[0]
    assert f"{keep - record_start} bytes dropped" in warnings[0]
    assert path.stat().st_size == record_start
    assert part.end_offset() == 9
    assert [(r.key, r.value) for r in part.read()] == items[:9]
    part.append(b"new", b"record")
    assert part.flush() == 10
    assert [r.offset for r in part.read()] == list(range(10))
    part.close()


def test_zero_filled_tail_is_torn(system: FileChangelogSystem, caplog: pytest.LogCaptureFixture) -> None:
    items = write(system, 6)
    path = last_segment(system)
    with open(path, "ab") as f:
        f.write(b"\0" * 4096)
    with caplog.at_level(logging.WARNING):
        part = system.partition("s", 0)
    assert any("4096 bytes dropped" in r.getMessage() for r in caplog.records)
    assert part.end_offset() == 6 and [(r.key, r.value) for r in part.read()] == items
    part.close()


def test_reader_does_not_report_a_tail_as_corruption(system: FileChangelogSystem) -> None:
    items = write(system, 6)
    path = last_segment(system)
    os.truncate(path, path.stat().st_size - 3)
    reader = system.reader("s", 0)
    assert [(r.key, r.value) for r in reader.read()] == items[:5]
    assert reader.end_offset() == 5


@pytest.mark.parametrize("where", ["value", "crc", "length", "offset"])
def test_flipped_byte_mid_segment_is_corruption(system: FileChangelogSystem, where: str) -> None:
    write(system, 10)
    path = last_segment(system)
    data = bytearray(path.read_bytes())
    # record 3 starts after three records; find it by walking lengths
    pos = 0
    for _ in range(3):
        klen = int.from_bytes(data[pos + 20:pos + 24], "little")
        vlen = int.from_bytes(data[pos + 24:pos + 28], "little", signed=True)
        pos += 28 + klen + max(vlen, 0)
    target = {"value": pos + 28 + 7, "crc": pos + 1, "length": pos + 25, "offset": pos + 4}[where]
    data[target] ^= 0x40
    path.write_bytes(bytes(data))
    for opener in (lambda: list(system.reader("s", 0).read()), lambda: system.partition("s", 0)):
        with pytest.raises(ChangelogCorruptError) as info:
            opener()
        ctx = info.value.context
        assert ctx["stream"] == "s" and ctx["partition"] == 0 and ctx["offset"] == 3
        assert str(path) == ctx["segment"] and info.value.hint
    # reading the records before the damage still works
    assert [r.offset for r in system.reader("s", 0).read(0, 3)] == [0, 1, 2]


def test_corruption_in_sealed_segment(small: FileChangelogSystem) -> None:
    part = small.partition("s", 0)
    part.append_many((b"k%d" % i, b"v" * 50) for i in range(40))
    part.flush()
    part.close()
    directory = small.partition_dir("s", 0)
    bases = list_segments(directory)
    first = directory / segment_name(bases[0])
    data = bytearray(first.read_bytes())
    data[-3] ^= 1                          # last record of a sealed segment: not a tail
    first.write_bytes(bytes(data))
    small.partition("s", 0).close()        # the writer only checks the active segment
    with pytest.raises(ChangelogCorruptError) as info:
        list(small.reader("s", 0).read())
    assert info.value.context["segment"] == str(first)
    # a truncated sealed segment is corruption too
    first.write_bytes(bytes(data[:-10]))
    with pytest.raises(ChangelogCorruptError):
        list(small.reader("s", 0).read())
