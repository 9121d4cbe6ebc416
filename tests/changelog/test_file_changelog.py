"""Round trips, segments, reopen, locking, readers, config errors of the file changelog."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from localstate.changelog.file import FileChangelogPartition, FileChangelogSystem
from localstate.changelog.framing import HEADER_SIZE
from localstate.changelog.file.format import list_segments, segment_name
from localstate.core.changelog import ChangelogRecord
from localstate.errors import ChangelogError, ConfigError, InvalidNameError

from .conftest import state


def records_of(part) -> list[tuple[int, bytes, bytes | None]]:  # noqa: ANN001
    return [(r.offset, r.key, r.value) for r in part.read()]


def test_round_trip_tombstones_empty_and_large(system: FileChangelogSystem) -> None:
    part = system.partition("s", 0)
    big = os.urandom(1 << 20)
    data = [(b"a", b"1"), (b"", b"empty key"), (b"empty value", b""), (b"a", None), (b"big", big),
            (b"", b""), (b"b", None)]
    part.append(*data[0])
    part.append_many(data[1:])
    assert part.end_offset() == 7          # unflushed appends count
    assert list(part.read()) == []         # but are not readable before flush
    assert part.flush() == 7
    got = list(part.read())
    assert all(isinstance(r, ChangelogRecord) for r in got)
    assert [(r.key, r.value) for r in got] == data
    assert [r.offset for r in got] == list(range(7))
    for start in range(8):
        assert [r.offset for r in part.read(start)] == list(range(start, 7))
        for end in range(start, 8):
            assert [r.offset for r in part.read(start, end)] == list(range(start, end))
    assert part.flush() == 7               # empty flush: same end
    assert state(part.read()) == {b"": b"", b"empty value": b"", b"big": big}
    part.close()


def test_segment_rolling_and_reading_across(small: FileChangelogSystem) -> None:
    part = small.partition("s", 0)
    expected = []
    for batch in range(6):
        items = [(b"k%d" % i, b"v" * (i % 40)) for i in range(batch * 10, batch * 10 + 10)]
        part.append_many(items)
        assert part.flush() == (batch + 1) * 10
        expected += items
    directory = small.partition_dir("s", 0)
    bases = list_segments(directory)
    assert len(bases) > 5 and bases[0] == 0
    for base in bases:
        assert (directory / segment_name(base)).exists()
        assert len(segment_name(base)) == 24
    # each segment starts with the record whose offset is its name; sizes bounded by one record
    for base in bases:
        first = next(part.read(base))
        assert first.offset == base
    for base in bases[:-1]:
        size = (directory / segment_name(base)).stat().st_size
        assert 300 <= size < 300 + HEADER_SIZE + 50
    assert [(r.key, r.value) for r in part.read()] == expected
    for start in range(0, 61, 7):
        assert [r.offset for r in part.read(start)] == list(range(start, 60))
    part.close()


def test_one_huge_flush_rolls_inside_the_batch(small: FileChangelogSystem) -> None:
    part = small.partition("s", 0)
    part.append_many((b"k%d" % i, b"x" * 100) for i in range(50))
    assert part.flush() == 50
    assert len(list_segments(small.partition_dir("s", 0))) >= 15
    assert [r.offset for r in part.read()] == list(range(50))
    part.close()


def test_reopen_continues_offsets(small: FileChangelogSystem) -> None:
    part = small.partition("s", 1)
    part.append_many((b"k%d" % i, b"v%d" % i) for i in range(25))
    part.flush()
    part.append(b"lost", b"never flushed")
    part.close()
    again = small.partition("s", 1)
    assert again.end_offset() == 25
    again.append(b"next", b"value")
    assert again.flush() == 26
    assert records_of(again)[-1] == (25, b"next", b"value")
    assert [r.offset for r in again.read()] == list(range(26))
    again.close()


def test_single_writer_lock_and_concurrent_reader(system: FileChangelogSystem) -> None:
    writer = system.partition("orders", 3)
    with pytest.raises(ChangelogError) as info:
        system.partition("orders", 3)
    assert info.value.context["stream"] == "orders" and info.value.context["partition"] == 3
    assert info.value.hint
    reader = system.reader("orders", 3)
    assert list(reader.read()) == [] and reader.end_offset() == 0
    writer.append(b"a", b"1")
    assert list(reader.read()) == []       # not flushed yet
    writer.flush()
    assert records_of(reader) == [(0, b"a", b"1")]
    assert reader.end_offset() == 1
    with pytest.raises(ChangelogError):
        reader.append(b"x", b"y")
    writer.close()
    system.partition("orders", 3).close()  # lock released by close


def test_reader_follows_across_segments_while_iterating(small: FileChangelogSystem) -> None:
    writer = small.partition("s", 0)
    reader = small.reader("s", 0)
    writer.append_many((b"k%d" % i, b"v" * 60) for i in range(5))
    writer.flush()
    it = reader.read()
    seen = [next(it).offset]
    # the writer appends (new segments appear) while the reader is mid-iteration
    writer.append_many((b"k%d" % i, b"v" * 60) for i in range(5, 30))
    writer.flush()
    seen += [r.offset for r in it]
    assert seen == list(range(30))
    writer.close()


def test_writer_read_stops_at_flushed_end(system: FileChangelogSystem) -> None:
    part = system.partition("s", 0)
    part.append(b"a", b"1")
    part.flush()
    part.append(b"b", b"2")
    assert [r.offset for r in part.read()] == [0]
    assert [r.offset for r in part.read(0, 10)] == [0]
    part.close()


def test_ensure_stream_metadata(system: FileChangelogSystem) -> None:
    system.ensure_stream("events", 4)
    system.ensure_stream("events", 4)
    meta = json.loads((system.stream_dir("events") / "stream.json").read_text())
    assert meta["partitions"] == 4
    with pytest.raises(ChangelogError) as info:
        system.ensure_stream("events", 5)
    assert "4 partitions" in str(info.value) and info.value.hint
    with pytest.raises(ChangelogError):
        system.partition("events", 4)
    system.partition("events", 3).close()


def test_concurrent_ensure_stream_creates_one_valid_stream(system: FileChangelogSystem) -> None:
    """Spark workers of one job create the same streams at the same moment: none may fail, and the
    stream metadata ends up whole (each writer uses its own temporary file)."""
    import threading

    streams = [f"s{i}" for i in range(40)]
    start = threading.Barrier(6)
    errors: list[BaseException] = []

    def create_all() -> None:
        start.wait()
        for stream in streams:
            try:
                system.ensure_stream(stream, 3)
            except BaseException as exc:  # collected, asserted below
                errors.append(exc)

    threads = [threading.Thread(target=create_all) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    for stream in streams:
        directory = system.stream_dir(stream)
        assert json.loads((directory / "stream.json").read_text())["partitions"] == 3
        assert sorted(p.name for p in directory.iterdir() if p.name.endswith(".tmp")) == []


def test_bad_config_and_names(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        FileChangelogSystem({"segment_byte": "1MB"}, tmp_path)
    assert "changelog.segment_byte" in str(info.value) and "segment_bytes" in str(info.value)
    with pytest.raises(ConfigError) as info:
        FileChangelogSystem({"segment_bytes": "lots"}, tmp_path)
    assert "changelog.segment_bytes" in str(info.value)
    with pytest.raises(ConfigError):
        FileChangelogSystem({"segment_bytes": 0}, tmp_path)
    with pytest.raises(ConfigError):
        FileChangelogSystem({"fsync": "yes"}, tmp_path)
    with pytest.raises(ConfigError):
        FileChangelogSystem({"tombstone_retention": "soon"}, tmp_path)
    s = FileChangelogSystem({"segment_bytes": "1KB", "tombstone_retention": "2h", "path": "cl"}, tmp_path)
    assert s.segment_bytes == 1024 and s.tombstone_retention == 7200.0
    assert s.root == tmp_path / "cl"
    assert FileChangelogSystem.validate({}, "x")["segment_bytes"] == 64 << 20
    for bad in ("../x", "..", "a/b", ""):
        with pytest.raises(InvalidNameError):
            s.partition(bad, 0)
        with pytest.raises(InvalidNameError):
            s.ensure_stream(bad, 1)
    with pytest.raises(ChangelogError):
        s.partition("ok", -1)
    assert not (tmp_path / "x").exists()


def test_append_rejects_non_bytes(system: FileChangelogSystem) -> None:
    part = system.partition("s", 0)
    part.append(b"good", b"1")
    with pytest.raises(ChangelogError):
        part.append("text", b"1")  # type: ignore[arg-type]
    with pytest.raises(ChangelogError):
        part.append_many([(b"ok", b"2"), (b"bad", 3)])  # type: ignore[list-item]
    assert part.end_offset() == 2
    assert part.flush() == 2
    assert [(r.key, r.value) for r in part.read()] == [(b"good", b"1"), (b"ok", b"2")]
    part.close()


def test_partition_usable_directly(tmp_path: Path) -> None:
    with FileChangelogPartition(tmp_path / "p", fsync=True) as part:
        part.append(b"k", b"v")
        assert part.flush() == 1
    reader = FileChangelogPartition(tmp_path / "p", writable=False)
    assert records_of(reader) == [(0, b"k", b"v")]
    with pytest.raises(ChangelogError):
        part.append(b"k", b"v")   # closed


def test_sparse_index_seeks_match_full_scans(system: FileChangelogSystem,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    from localstate.changelog.file import partition as partition_module
    monkeypatch.setattr(partition_module, "_CHUNK", 97)   # many chunks: records split across reads
    monkeypatch.setattr(partition_module, "_BATCH_BYTES", 50)
    monkeypatch.setattr(partition_module, "_MARK_BYTES", 50)  # many remembered positions
    part = system.partition("s", 0)
    items = [(b"k%d" % (i % 17), None if i % 11 == 0 else b"v" * (i % 70)) for i in range(400)]
    part.append_many(items)
    part.flush()
    reader = system.reader("s", 0)
    full = list(reader.read())
    assert [(r.key, r.value) for r in full] == items
    for start in list(range(0, 401, 13)) + [399, 400, 5000]:
        for _ in range(2):                                  # second round uses the index
            assert list(reader.read(start)) == full[start:]
            assert list(reader.read(start, start + 9)) == full[start:start + 9]
    assert len(reader._marks[0]) > 50
    part.close()
    # a compacted segment is a new file: old marks must not be used for it
    system2 = FileChangelogSystem({"fsync": False, "segment_bytes": 2000}, system.state_dir / "two")
    w = system2.partition("s", 0)
    w.append_many(items)
    w.flush()
    r2 = system2.reader("s", 0)
    before = list(r2.read())
    for start in range(0, 400, 7):
        list(r2.read(start))
    system2.compact("s", 0, 300)
    after = list(r2.read())
    assert len(after) < len(before)
    for start in range(0, 401, 7):
        assert list(r2.read(start)) == [r for r in after if r.offset >= start]
    w.close()


def test_reader_end_offset_tracks_appends(small: FileChangelogSystem) -> None:
    writer = small.partition("s", 0)
    reader = small.reader("s", 0)
    for i in range(1, 40):
        writer.append(b"k", b"v" * i)
        writer.flush()
        assert reader.end_offset() == i
    writer.append(b"k", b"unflushed")
    assert reader.end_offset() == 39
    writer.close()


def test_read_batches_match_read(small: FileChangelogSystem, monkeypatch: pytest.MonkeyPatch) -> None:
    from localstate.changelog.file import partition as partition_module
    from localstate.changelog.memory import MemoryChangelogPartition

    monkeypatch.setattr(partition_module, "_BATCH_BYTES", 100)   # several batches per segment
    part = small.partition("s", 0)
    memory = MemoryChangelogPartition("s", 0)
    items = [(b"k%d" % (i % 13), None if i % 7 == 0 else b"v" * (i % 50)) for i in range(300)]
    for log in (part, memory):
        log.append_many(items)
        log.flush()
    for log in (part, memory, small.reader("s", 0)):   # file override, file reader, core default
        for start, end in ((0, None), (17, 250), (299, 300), (300, None)):
            batches = list(log.read_batches(start, end))
            assert all(isinstance(batch, list) and batch for batch in batches)
            assert [r for batch in batches for r in batch] == list(log.read(start, end))
    assert len(list(part.read_batches())) > 10
    part.close()
