"""Compaction: last value per key below ``upto``, tombstone retention, restore equivalence, and
compaction racing a writer and a following reader."""

from __future__ import annotations

import random
import threading
import time
from pathlib import Path

import pytest

from localstate.changelog.file import FileChangelogSystem, compact_stream
from localstate.changelog.file.format import list_segments
from localstate.errors import ChangelogError

from .conftest import state

DAY = 86400.0


def fill(part, ops) -> None:  # noqa: ANN001
    for i in range(0, len(ops), 7):
        part.append_many(ops[i:i + 7])
        part.flush()


def random_ops(rng: random.Random, n: int, keys: int) -> list[tuple[bytes, bytes | None]]:
    return [(b"k%d" % rng.randrange(keys), None if rng.random() < 0.15 else b"v%d" % i * rng.randrange(1, 5))
            for i in range(n)]


def test_last_value_per_key_and_upto_boundary(small: FileChangelogSystem) -> None:
    part = small.partition("s", 0)
    rng = random.Random(1)
    ops = random_ops(rng, 300, 20)
    fill(part, ops)
    before = list(part.read())
    upto = 180
    stats = small.compact("s", 0, upto)
    after = list(part.read())
    # records at/after upto: untouched
    assert [r for r in after if r.offset >= upto] == [r for r in before if r.offset >= upto]
    # below upto: at most one record per key, and it is the last one below upto (in sealed segments)
    below = [r for r in after if r.offset < upto]
    last_below = {}
    for r in before:
        if r.offset < upto:
            last_below[r.key] = r
    active_base = list_segments(small.partition_dir("s", 0))[-1]
    sealed_below = [r for r in below if r.offset < active_base]
    assert len({r.key for r in sealed_below}) == len(sealed_below)
    assert all(last_below[r.key] == r for r in sealed_below)
    # every last-below record survives (tombstones are young: retention 1 day)
    kept = {r.offset for r in after}
    assert all(r.offset in kept for r in last_below.values())
    assert [r.offset for r in after] == sorted(kept)
    assert stats.records_after < stats.records_before and stats.bytes_after < stats.bytes_before
    assert state(after) == state(before)
    # the writer continues after compaction with the right offsets
    part.append(b"k1", b"after")
    assert part.flush() == 301 and list(part.read(300))[0].value == b"after"
    # compacting again changes nothing
    again = small.compact("s", 0, upto)
    assert again.records_after == again.records_before and list(part.read(0, 300)) == after
    part.close()


def test_tombstone_retention(tmp_path: Path) -> None:
    system = FileChangelogSystem({"fsync": False, "segment_bytes": 100, "tombstone_retention": "1h"}, tmp_path)
    part = system.partition("s", 0)
    fill(part, [(b"a", b"1"), (b"b", b"1"), (b"a", None), (b"c", None), (b"b", None), (b"z", b"x" * 200)])
    part.append(b"b", b"2")                    # b tombstone at 4 is below upto; b=2 at 6 is above
    part.flush()
    now = time.time()
    system.compact("s", 0, 5, now=now)         # tombstones are fresh: kept
    assert [(r.key, r.value) for r in part.read()] == [(b"a", None), (b"c", None), (b"b", None),
                                                       (b"z", b"x" * 200), (b"b", b"2")]
    stats = system.compact("s", 0, 5, now=now + 2 * 3600)   # 2h later: dropped
    assert stats.tombstones_dropped == 3
    assert [(r.offset, r.key, r.value) for r in part.read()] == [(5, b"z", b"x" * 200), (6, b"b", b"2")]
    # a tombstone at/after upto is never dropped, however old
    part.append(b"z", None)
    part.append(b"y", b"1")
    part.flush()
    system.compact("s", 0, 7, now=now + 10 * DAY)
    assert [(r.offset, r.value) for r in part.read()] == [(5, b"x" * 200), (6, b"2"), (7, None), (8, b"1")]
    part.append(b"w", b"1")
    part.flush()
    system.compact("s", 0, 9, now=now + 10 * DAY)   # now z at 5 is superseded by its tombstone at 7
    assert [(r.offset, r.value) for r in part.read()] == [(6, b"2"), (7, None), (8, b"1"), (9, b"1")]
    part.close()


@pytest.mark.parametrize("seed", [2, 3, 4])
def test_restore_from_compacted_equals_uncompacted(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    system = FileChangelogSystem({"fsync": False, "segment_bytes": rng.choice([64, 500, 4000])}, tmp_path)
    part = system.partition("s", 0)
    for _round in range(4):
        fill(part, random_ops(rng, 400, 40))
        expected = state(part.read())
        end = part.end_offset()
        upto = rng.randrange(end + 1)
        tail = list(part.read(upto))
        system.compact("s", 0, upto, now=time.time() + rng.choice([0, 2 * DAY]))
        assert state(part.read()) == expected
        # also a restore that starts at the boundary and replays the rest
        assert list(part.read(upto)) == tail
    part.close()


def test_compact_stream_stats_and_lock(small: FileChangelogSystem) -> None:
    for p in range(2):
        part = small.partition("t", p)
        fill(part, [(b"k%d" % (i % 3), b"v%d" % i) for i in range(60)])
        part.close()
    stats = compact_stream(small, "t", {0: 60, 1: 30})
    assert set(stats.partitions) == {0, 1}
    assert stats.records_before == sum(s.records_before for s in stats.partitions.values())
    assert stats.records_after < stats.records_before and stats.bytes_after < stats.bytes_before
    assert stats.seconds >= 0 and "bytes_after" in stats.as_dict()
    import fcntl
    import os
    fd = os.open(small.partition_dir("t", 0) / "compact.lock", os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        with pytest.raises(ChangelogError):
            small.compact("t", 0, 60)
    finally:
        os.close(fd)


def test_background_compactor(tmp_path: Path) -> None:
    system = FileChangelogSystem({"fsync": False, "segment_bytes": 200, "compact_interval": "10ms"}, tmp_path)
    part = system.partition("s", 0)
    fill(part, [(b"k%d" % (i % 2), b"v%d" % i) for i in range(100)])
    compactor = system.start_compactor(lambda: {("s", 0): part.end_offset()})
    deadline = time.monotonic() + 10
    while compactor.runs < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    system.close()
    assert compactor.runs >= 2 and compactor.last_error is None
    assert len(list(part.read())) < 20
    assert state(part.read()) == {b"k0": b"v98", b"k1": b"v99"}
    with pytest.raises(ChangelogError):
        FileChangelogSystem({}, tmp_path).start_compactor(lambda: {})
    part.close()


def test_compaction_while_reader_follows_and_writer_appends(tmp_path: Path) -> None:
    system = FileChangelogSystem({"fsync": False, "segment_bytes": 2048}, tmp_path)
    writer = system.partition("s", 0)
    reader = system.reader("s", 0)
    rng = random.Random(7)
    expected: dict[bytes, bytes] = {}
    done = threading.Event()
    errors: list[BaseException] = []
    seen: dict[bytes, bytes] = {}
    compactions = [0]

    def follow() -> None:
        try:
            nxt = 0
            while True:
                finished = done.is_set()
                for r in reader.read(nxt):
                    assert r.offset >= nxt, "offsets must increase"
                    nxt = r.offset + 1
                    if r.value is None:
                        seen.pop(r.key, None)
                    else:
                        seen[r.key] = r.value
                if finished:
                    return
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            errors.append(exc)

    def compact() -> None:
        try:
            while not done.is_set():
                system.compact("s", 0, writer.flushed_end())
                compactions[0] += 1
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=follow), threading.Thread(target=compact)]
    for t in threads:
        t.start()
    for i in range(300):
        batch = []
        for _ in range(20):
            key = b"k%d" % rng.randrange(50)
            value = None if rng.random() < 0.1 else b"%d" % i * rng.randrange(1, 20)
            batch.append((key, value))
            if value is None:
                expected.pop(key, None)
            else:
                expected[key] = value
        writer.append_many(batch)
        writer.flush()
    done.set()
    for t in threads:
        t.join(60)
    assert not errors, errors
    assert compactions[0] > 0
    assert seen == expected
    assert state(reader.read()) == expected
    writer.close()
