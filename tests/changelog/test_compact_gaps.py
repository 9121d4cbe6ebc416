"""Gaps in a file changelog: those compaction made (recorded in compaction.json) are read through;
any other missing segment — first, middle, several, one compaction had rewritten — is a
ChangelogCorruptError naming the segment and the offsets, from readers, restores and compaction."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from localstate.changelog.file import FileChangelogSystem
from localstate.changelog.file.compaction import MANIFEST
from localstate.changelog.file.format import list_segments, segment_name
from localstate.core.engine import StoreContext
from localstate.runtime.partition.recovery import recover_store
from localstate.core.changelog import NullChangelogWriter
from localstate.core.registry import Registry
from localstate.errors import ChangelogCorruptError

from .conftest import state

KEYS = 10


@pytest.fixture
def tiny(tmp_path: Path) -> FileChangelogSystem:
    s = FileChangelogSystem({"fsync": False, "segment_bytes": 400}, tmp_path)
    yield s
    s.close()


def fill(system: FileChangelogSystem, n: int, start: int = 0) -> int:
    """Append ``n`` records over KEYS keys (every 7th a tombstone); returns the end offset."""
    part = system.partition("s", 0)
    part.append_many((b"k%d" % (i % KEYS), None if i % 7 == 6 else b"v%05d" % i) for i in range(start, start + n))
    end = part.flush()
    part.close()
    return end


def directory(system: FileChangelogSystem) -> Path:
    return system.partition_dir("s", 0)


def read_all(system: FileChangelogSystem, start: int = 0, end: int | None = None) -> list:
    return list(system.reader("s", 0).read(start, end))


def delete(system: FileChangelogSystem, base: int) -> None:
    os.unlink(directory(system) / segment_name(base))


def expect_missing(system: FileChangelogSystem, base: int, start: int = 0) -> ChangelogCorruptError:
    with pytest.raises(ChangelogCorruptError) as info:
        read_all(system, start)
    error = info.value
    assert segment_name(base) in str(error)
    assert error.context["segment"].endswith(segment_name(base))
    assert error.context["stream"] == "s" and error.context["partition"] == 0
    assert error.context["offset"] == base
    assert error.hint
    return error


def test_deleted_middle_segment_is_an_error_naming_it(tiny):
    fill(tiny, 100)
    bases = list_segments(directory(tiny))
    assert len(bases) >= 4
    delete(tiny, bases[2])
    error = expect_missing(tiny, bases[2])
    assert f"{bases[2]}..{bases[3] - 1}" in str(error)


def test_deleted_first_segment_is_an_error(tiny):
    fill(tiny, 100)
    bases = list_segments(directory(tiny))
    delete(tiny, bases[0])
    expect_missing(tiny, 0)


def test_several_deleted_segments_name_the_first(tiny):
    fill(tiny, 100)
    bases = list_segments(directory(tiny))
    delete(tiny, bases[1])
    delete(tiny, bases[2])
    error = expect_missing(tiny, bases[1])
    assert f"{bases[1]}..{bases[3] - 1}" in str(error)


def test_reads_that_do_not_need_the_missing_records_work(tiny):
    end = fill(tiny, 100)
    bases = list_segments(directory(tiny))
    delete(tiny, bases[1])
    assert [r.offset for r in read_all(tiny, 0, bases[1])] == list(range(bases[1]))
    assert [r.offset for r in read_all(tiny, bases[2])] == list(range(bases[2], end))


def test_compaction_gaps_are_read_through_and_restore_is_exact(tiny):
    end = fill(tiny, 120)
    expected = state(read_all(tiny))
    stats = tiny.compact("s", 0, end, now=0)  # now=0: no tombstone is old enough to drop
    assert stats.segments_deleted > 0  # whole segments emptied, including the first
    assert list_segments(directory(tiny))[0] > 0
    assert state(read_all(tiny)) == expected
    manifest = json.loads((directory(tiny) / MANIFEST).read_text())
    assert manifest["removed"] and manifest["removed"][0][0] == 0
    # Reading from any offset inside a removed range works too.
    for start in range(0, end, 13):
        read_all(tiny, start)


def test_segment_deleted_after_compaction_is_still_an_error(tiny):
    fill(tiny, 120)
    stats = tiny.compact("s", 0, 80, now=0)
    assert stats.segments_rewritten > 0 and stats.segments_deleted > 0
    manifest = json.loads((directory(tiny) / MANIFEST).read_text())
    rewritten = [b for b in list_segments(directory(tiny)) if str(b) in manifest["ends"]]
    assert rewritten
    # A segment compaction rewrote (its tail is a recorded gap) and then somebody deleted.
    victim = rewritten[0]
    delete(tiny, victim)
    error = expect_missing(tiny, victim)
    assert "compaction did not remove them" in str(error)


def test_compaction_refuses_to_run_over_an_unrecorded_gap(tiny):
    end = fill(tiny, 100)
    bases = list_segments(directory(tiny))
    delete(tiny, bases[1])
    snapshot = {p.name: p.read_bytes() for p in directory(tiny).iterdir() if p.suffix == ".log"}
    with pytest.raises(ChangelogCorruptError) as info:
        tiny.compact("s", 0, end, now=0)
    assert segment_name(bases[1]) in str(info.value)
    # Nothing changed and no manifest legitimised the gap.
    assert {name: (directory(tiny) / name).read_bytes() for name in snapshot} == snapshot
    assert not (directory(tiny) / MANIFEST).exists()
    expect_missing(tiny, bases[1])


def test_unreadable_manifest_is_a_typed_error(tiny):
    end = fill(tiny, 120)
    tiny.compact("s", 0, end, now=0)
    (directory(tiny) / MANIFEST).write_text("{not json")
    with pytest.raises(ChangelogCorruptError) as info:
        read_all(tiny)
    assert MANIFEST in str(info.value) and info.value.hint


def test_restore_over_a_deleted_segment_fails_naming_it(tiny, tmp_path):
    end = fill(tiny, 100)
    bases = list_segments(directory(tiny))
    delete(tiny, bases[1])
    registry = Registry()
    factory = registry.engine_factory("kv")
    context = StoreContext(job="j", store="st", partition=0, directory=tmp_path / "store",
                           options=factory.validate_options("st", {"backend": "rocksdb"}),
                           key_serde=registry.serde("bytes"), value_serde=registry.serde("bytes"),
                           changelog=NullChangelogWriter(), logged=True)
    context.directory.mkdir()
    engine = factory.create(context)
    try:
        with pytest.raises(ChangelogCorruptError) as info:
            recover_store(engine, tiny.reader("s", 0), end, label="st[0]")
        assert segment_name(bases[1]) in str(info.value)
    finally:
        engine.close()


def test_writer_refuses_to_reuse_offsets_of_deleted_segments_after_compaction(tiny):
    part = tiny.partition("s", 0)
    # Unique keys (kept) between writes of one hot key (superseded): segments keep records but lose tails.
    part.append_many((b"u%d" % i if i % 4 == 0 else b"hot", b"v%05d" % i) for i in range(120))
    end = part.flush()
    part.close()
    tiny.compact("s", 0, end, now=0)
    bases = list_segments(directory(tiny))
    manifest = json.loads((directory(tiny) / MANIFEST).read_text())
    offsets = [r.offset for r in read_all(tiny)]
    # A segment whose tail compaction dropped: it ends before the next segment's base.
    shortened = [b for b in bases if str(b) in manifest["ends"]
                 and max(o for o in offsets if b <= o < manifest["ends"][str(b)]) + 1 < manifest["ends"][str(b)]]
    assert shortened
    # Delete every segment after it (the active one included): a writer would reuse their offsets.
    for base in bases:
        if base > shortened[0]:
            delete(tiny, base)
    lost = manifest["ends"][str(shortened[0])]
    with pytest.raises(ChangelogCorruptError) as info:
        tiny.partition("s", 0)
    assert segment_name(lost) in str(info.value)
