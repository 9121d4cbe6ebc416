"""read_columns(): the bulk decoder yields exactly what read() yields, on random logs (rolled
segments, compaction gaps, tombstones, empty keys and values), and fails the same way, with the same
typed error naming the same segment, offset and byte, on damaged segment files."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from localstate.changelog.file import FileChangelogSystem
from localstate.changelog.file.format import list_segments, segment_name
from localstate.core.changelog import ChangelogPartition, RecordColumns
from localstate.errors import ChangelogCorruptError, LocalStateError

keys = st.binary(min_size=0, max_size=12)
values = st.one_of(st.none(), st.binary(min_size=0, max_size=40))
records = st.lists(st.tuples(keys, values), min_size=0, max_size=120)
SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def _columns(part: ChangelogPartition, start: int = 0, end: int | None = None) -> list[tuple[bytes, bytes | None]]:
    out: list[tuple[bytes, bytes | None]] = []
    for run in part.read_columns(start, end):
        assert isinstance(run, RecordColumns) and len(run.keys) == len(run.values) > 0
        out.extend(zip(run.keys, run.values))
    return out


def _records(part: ChangelogPartition, start: int = 0, end: int | None = None) -> list[tuple[bytes, bytes | None]]:
    return [(r.key, r.value) for r in part.read(start, end)]


def _outcome(read) -> tuple[str, object]:  # noqa: ANN001
    """What a read does: its records, or the typed error it raises (class and context)."""
    try:
        return "ok", read()
    except LocalStateError as exc:
        return type(exc).__name__, (exc.context.get("segment"), exc.context.get("offset"), exc.context.get("byte"))


@SETTINGS
@given(log=records, flushes=st.lists(st.integers(1, 30), min_size=1, max_size=10), data=st.data())
def test_columns_equal_records(tmp_path_factory: pytest.TempPathFactory, log, flushes, data) -> None:  # noqa: ANN001
    root = tmp_path_factory.mktemp("columns")
    system = FileChangelogSystem({"fsync": False, "segment_bytes": 200}, root)
    part = system.partition("s", 0)
    position, step = 0, 0
    while position < len(log):
        size = flushes[step % len(flushes)]
        part.append_many(log[position:position + size])
        part.flush()
        position, step = position + size, step + 1
    end = part.flushed_end()
    assert _columns(part) == _records(part) == log
    start = data.draw(st.integers(0, end + 2))
    stop = data.draw(st.one_of(st.none(), st.integers(0, end + 2)))
    assert _columns(part, start, stop) == _records(part, start, stop)
    reader = system.reader("s", 0)
    assert _columns(reader, start, stop) == _records(reader, start, stop)
    # After compaction the offsets have gaps: both readers still agree.
    if end:
        system.compact("s", 0, data.draw(st.integers(0, end)), now=0.0)
        assert _columns(reader) == _records(reader)
        assert _columns(reader, start, stop) == _records(reader, start, stop)
    reader.close()
    part.close()
    system.close()


def _write(system: FileChangelogSystem, count: int) -> None:
    part = system.partition("s", 0)
    for i in range(count):
        part.append(b"key-%03d" % (i % 7), None if i % 5 == 4 else b"value-%d" % i)
        if i % 4 == 3:
            part.flush()
    part.flush()
    part.close()


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(where=st.floats(0, 1, exclude_max=True), xor=st.integers(1, 255), segment=st.integers(0, 10))
def test_damaged_byte_same_error(tmp_path_factory: pytest.TempPathFactory, where: float, xor: int,
                                 segment: int) -> None:
    """A flipped byte anywhere: read() and read_columns() raise the same ChangelogCorruptError (same
    segment, offset and byte) or, for a torn-looking tail of the last segment, yield the same records."""
    root = tmp_path_factory.mktemp("damaged")
    system = FileChangelogSystem({"fsync": False, "segment_bytes": 400}, root)
    _write(system, 60)
    directory = system.partition_dir("s", 0)
    bases = list_segments(directory)
    path = directory / segment_name(bases[segment % len(bases)])
    data = bytearray(path.read_bytes())
    data[int(where * len(data))] ^= xor
    path.write_bytes(bytes(data))
    reader = system.reader("s", 0)
    by_records = _outcome(lambda: _records(reader))
    by_columns = _outcome(lambda: _columns(reader))
    assert by_columns == by_records
    if by_records[0] != "ok":
        assert by_records[0] == "ChangelogCorruptError" and by_records[1][0] == str(path)
    reader.close()
    system.close()


def test_damaged_record_names_segment_offset_byte(tmp_path: Path) -> None:
    system = FileChangelogSystem({"fsync": False, "segment_bytes": 400}, tmp_path)
    _write(system, 60)
    directory = system.partition_dir("s", 0)
    first = directory / segment_name(list_segments(directory)[0])
    data = bytearray(first.read_bytes())
    data[40] ^= 0xFF  # inside the first record's key or value: its crc fails, valid records follow
    first.write_bytes(bytes(data))
    with pytest.raises(ChangelogCorruptError) as info:
        _columns(system.reader("s", 0))
    assert info.value.context["segment"] == str(first)
    assert info.value.context["offset"] == 0 and info.value.context["byte"] == 0


def test_deleted_segment_is_loss_for_columns(tmp_path: Path) -> None:
    system = FileChangelogSystem({"fsync": False, "segment_bytes": 200}, tmp_path)
    _write(system, 40)
    directory = system.partition_dir("s", 0)
    bases = list_segments(directory)
    (directory / segment_name(bases[1])).unlink()  # not compaction: records lost
    with pytest.raises(ChangelogCorruptError):
        _columns(system.reader("s", 0))
    with pytest.raises(ChangelogCorruptError):
        _records(system.reader("s", 0))


def test_default_read_columns_from_read_batches() -> None:
    """The contract's default (any system without its own decoder) converts read_batches()."""
    from localstate.changelog.memory import MemoryChangelogPartition

    part = MemoryChangelogPartition("m", 0)
    part.append_many([(b"a", b"1"), (b"b", None), (b"a", b"2")])
    part.flush()
    runs = list(part.read_columns(1))
    assert [(r.keys, r.values, r.end) for r in runs] == [([b"b", b"a"], [None, b"2"], 3)]
