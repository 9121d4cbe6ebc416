"""Compaction: last value per key below ``upto``, tombstone retention, restore equivalence, and
compaction racing a writer and a following reader."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from localstate.changelog.file import FileChangelogSystem, compact_stream
from localstate.changelog.file.compaction import PARENT_OPTION, BackgroundCompactor
from localstate.changelog.file.format import list_segments, segment_name
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
        FileChangelogSystem({"compact_interval": 0}, tmp_path).start_compactor(lambda: {})
    part.close()


@pytest.mark.parametrize("in_child", [True, False])
def test_one_round_in_a_child_process_or_in_process(tmp_path: Path, in_child: bool) -> None:
    """A round (the driver's ``run_once``) compacts the same in a child process as in process, and
    reports the child's figures and per-target failures."""
    system = FileChangelogSystem({"fsync": False, "segment_bytes": 200}, tmp_path)
    part = system.partition("s", 0)
    fill(part, [(b"k%d" % (i % 3), b"v%d" % i) for i in range(90)])
    part.roll()
    broken = system.partition("t", 0)
    fill(broken, [(b"k%d" % (i % 3), b"v%d" % i) for i in range(30)])
    broken.roll()
    broken.close()
    first = system.partition_dir("t", 0) / segment_name(list_segments(system.partition_dir("t", 0))[0])
    data = bytearray(first.read_bytes())
    data[30] ^= 0xFF  # a record below upto fails its crc: that partition's compaction refuses
    first.write_bytes(bytes(data))
    rounds = BackgroundCompactor(system, 0.0, lambda: {("s", 0): part.end_offset(), ("t", 0): 30},
                                 in_child=in_child)
    stats = rounds.run_once()
    assert stats.records_before == 90 and stats.records_after == 3 and stats.segments_rewritten > 0
    assert isinstance(rounds.last_error, ChangelogError) and rounds.runs == 1
    assert state(part.read()) == {b"k0": b"v87", b"k1": b"v88", b"k2": b"v89"}
    part.close()
    system.close()


def _gone_or_zombie(pid: int, within: float = 60.0) -> bool:
    """True once ``pid`` has ended (or is a zombie waiting for init), within ``within`` seconds."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
            with open(f"/proc/{pid}/stat") as stat:
                if stat.read().split(") ")[1].startswith("Z"):
                    return True
        except (ProcessLookupError, FileNotFoundError):
            return True
        time.sleep(0.05)
    return False


@pytest.mark.parametrize("settle", [0.0, 0.5], ids=["killed while the child starts", "killed while it waits"])
def test_the_compaction_child_dies_with_its_parent(request: pytest.FixtureRequest, settle: float) -> None:
    """A driver SIGKILLed while a round runs leaves no compaction process behind, whenever it dies:
    before the child armed its parent-death signal (the child sees its parent changed) or after."""
    # The child waits for its request on a pipe that a third process also holds open, so the
    # parent's death does not end the child's input: only the child's own checks can stop it (as
    # a child busy compacting, which reads nothing, would be stopped).
    parent = subprocess.Popen([sys.executable, "-c", textwrap.dedent("""
        import os, subprocess, sys, time
        from localstate.changelog.file.compaction import PARENT_OPTION
        read, write = os.pipe()
        holder = subprocess.Popen(["sleep", "600"], pass_fds=(write,))
        child = subprocess.Popen([sys.executable, "-m", "localstate.changelog.file.compaction_child",
                                  PARENT_OPTION, str(os.getpid())], stdin=read, stdout=subprocess.DEVNULL)
        print(child.pid, holder.pid, flush=True)
        time.sleep(600)
        """)], stdout=subprocess.PIPE, text=True)
    child, holder = map(int, parent.stdout.readline().split())
    request.addfinalizer(lambda: os.kill(holder, signal.SIGKILL))
    time.sleep(settle)
    os.kill(parent.pid, signal.SIGKILL)
    parent.wait()
    if not _gone_or_zombie(child):
        os.kill(child, signal.SIGKILL)
        pytest.fail("the compaction child outlived its parent")


def test_a_compaction_child_whose_parent_is_already_gone_compacts_nothing(tmp_path: Path) -> None:
    """Started for a parent that is not its parent any more (it died, the child was adopted), the
    child exits at once with a message, without reading its request."""
    done = subprocess.run([sys.executable, "-m", "localstate.changelog.file.compaction_child", PARENT_OPTION, "1"],
                          input="{}", capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode != 0
    assert "parent 1 is gone" in done.stderr and done.stdout == ""


def test_compaction_while_reader_follows_and_writer_appends(tmp_path: Path) -> None:
    """A follower never errs, never sees an offset twice or a record that was not written at its
    offset, and misses only records compaction may remove (superseded by a later record of the key)."""
    system = FileChangelogSystem({"fsync": False, "segment_bytes": 2048}, tmp_path)
    writer = system.partition("s", 0)
    reader = system.reader("s", 0)
    rng = random.Random(7)
    expected: dict[bytes, bytes] = {}
    written: dict[int, tuple[bytes, bytes | None]] = {}
    done = threading.Event()
    compacted = threading.Event()
    errors: list[BaseException] = []
    seen: dict[bytes, bytes] = {}
    seen_offsets: list[int] = []
    follower_next = [0]
    compactions = [0]

    def follow() -> None:
        try:
            nxt = 0
            while True:
                finished = done.is_set()
                for r in reader.read(nxt):
                    assert r.offset >= nxt, "offsets must increase"
                    assert written[r.offset] == (r.key, r.value), "a record must be what was written there"
                    nxt = r.offset + 1
                    seen_offsets.append(r.offset)
                    if r.value is None:
                        seen.pop(r.key, None)
                    else:
                        seen[r.key] = r.value
                follower_next[0] = nxt
                if finished:
                    return
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            errors.append(exc)

    def compact() -> None:
        try:
            while not done.is_set():
                system.compact("s", 0, writer.flushed_end())
                compactions[0] += 1
                compacted.set()
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    def wait_for(condition) -> None:  # noqa: ANN001
        # Not a timing assertion: the bound only keeps a broken run from hanging the suite.
        deadline = time.monotonic() + 60
        while not condition() and not errors and time.monotonic() < deadline:
            time.sleep(0.001)

    threads = [threading.Thread(target=follow), threading.Thread(target=compact)]
    for t in threads:
        t.start()
    for i in range(300):
        batch = []
        for _ in range(20):
            key = b"k%d" % rng.randrange(50)
            value = None if rng.random() < 0.1 else b"%d" % i * rng.randrange(1, 20)
            batch.append((key, value))
            written[writer.end_offset() + len(batch) - 1] = (key, value)
            if value is None:
                expected.pop(key, None)
            else:
                expected[key] = value
        writer.append_many(batch)
        writer.flush()
        if i % 30 == 29:
            # Make sure compaction rounds and a caught-up follower really interleave with the appends,
            # however the threads are scheduled on a loaded machine.
            compacted.clear()
            wait_for(compacted.is_set)
            end = writer.flushed_end()
            wait_for(lambda: follower_next[0] >= end)
    done.set()
    for t in threads:
        t.join(60)
    assert not errors, errors
    assert not any(t.is_alive() for t in threads)
    assert compactions[0] >= 10
    assert seen == expected
    assert state(reader.read()) == expected
    assert len(seen_offsets) == len(set(seen_offsets))
    last_of_key = {key: offset for offset, (key, _value) in sorted(written.items())}
    missed = set(written) - set(seen_offsets)
    assert all(offset < last_of_key[written[offset][0]] for offset in missed), "a live record was missed"
    writer.close()


def test_follower_reads_what_was_appended_before_the_writer_rolled(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """The race behind a flaky follow test: the follower reaches the end of the last segment, and
    before it looks for newer segments the writer appends to that segment and rolls to a new one.
    The follower must read the records appended in between before moving to the new segment.
    (The writer's step is injected where the reader lists the directory, to hit the window every time.)"""
    from localstate.changelog.file import partition as partition_module

    system = FileChangelogSystem({"fsync": False, "segment_bytes": 200}, tmp_path)
    writer = system.partition("s", 0)
    writer.append_many([(b"k%d" % i, b"v") for i in range(3)])
    writer.flush()
    reader = system.reader("s", 0)
    records = reader.read()
    assert [next(records).offset for _ in range(3)] == [0, 1, 2]
    real_list_segments = partition_module.list_segments

    def writer_rolls_first(directory: Path) -> list[int]:
        monkeypatch.setattr(partition_module, "list_segments", real_list_segments)
        writer.append_many([(b"x%d" % i, b"v" * 50) for i in range(4)])  # 2 fit, then a new segment
        writer.flush()
        assert len(real_list_segments(directory)) == 2
        return real_list_segments(directory)

    monkeypatch.setattr(partition_module, "list_segments", writer_rolls_first)
    assert [r.offset for r in records] == [3, 4, 5, 6]
    assert partition_module.list_segments is real_list_segments  # the injected step did run
    writer.close()


def test_remembered_positions_are_checked_when_a_segment_file_is_replaced(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A reader remembers record positions per segment to seek fast. Compaction replaces a segment by a
    new file whose inode number can be the one of an older version (the file system reuses freed
    inodes), so positions must be checked against the file's content, not its identity."""
    import os

    from localstate.changelog.file import partition as partition_module
    from localstate.changelog.file.format import segment_name

    monkeypatch.setattr(partition_module, "_BATCH_BYTES", 64)
    monkeypatch.setattr(partition_module, "_MARK_BYTES", 64)
    system = FileChangelogSystem({"fsync": False, "segment_bytes": 4000}, tmp_path)
    writer = system.partition("s", 0)
    # every third key is written once: segment 0 keeps those records and shrinks
    fill(writer, [(b"u%d" % i if i % 3 == 0 else b"k%d" % (i % 10), b"v%d" % i) for i in range(200)])
    reader = system.reader("s", 0)
    before = list(reader.read())
    for start in range(0, 200, 9):                     # remember positions in segment 0
        list(reader.read(start))
    assert len(reader._marks[0]) > 10
    directory = system.partition_dir("s", 0)
    path = directory / segment_name(0)
    old_inode = directory / "old-inode"
    os.link(path, old_inode)                           # keep segment 0's inode alive
    system.compact("s", 0, writer.flushed_end())       # segment 0 is now a new, shorter file
    after = list(system.reader("s", 0).read())         # (another reader: this one has not seen it)
    assert len(after) < len(before) and state(after) == state(before)
    # The compacted segment reappears under its old inode number, as inode reuse would have it.
    old_inode.write_bytes(path.read_bytes())
    os.replace(old_inode, path)
    for start in range(0, 201, 3):
        assert list(reader.read(start)) == [r for r in after if r.offset >= start]
    writer.close()
