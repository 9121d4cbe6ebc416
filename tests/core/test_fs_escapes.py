"""Planted symlinks inside the state directory never lead a write, truncate or delete outside it:
every case plants a link to a victim outside the state dir, checks that localstate refuses with
UnsafePathError naming the link, and that the victim's bytes/mtime are unchanged and nothing was
created outside."""

import os
from pathlib import Path

import pytest

from localstate.changelog.file import FileChangelogSystem
from localstate.core.checkpoint import Checkpoint, CheckpointStore
from localstate.core.fsutil import write_atomic
from localstate.testing.driver import TaskTestDriver
from localstate.errors import UnsafePathError

STREAM = "log"
KV = {"counts": {"engine": "kv", "backend": "lmdb", "key_serde": "string", "value_serde": "int"}}


@pytest.fixture
def outside(tmp_path):
    """A victim directory outside the state dir holding one file; yields (dir, file, snapshot())."""
    victim_dir = tmp_path / "outside"
    victim_dir.mkdir()
    victim = victim_dir / "precious"
    victim.write_bytes(b"precious data\n" * 100)
    os.utime(victim, (1_000_000, 1_000_000))

    def snapshot():
        return sorted((p.name, p.read_bytes(), p.stat().st_mtime) for p in victim_dir.iterdir())

    return victim_dir, victim, snapshot


@pytest.fixture
def state(tmp_path):
    directory = tmp_path / "state"
    directory.mkdir()
    return directory


def _written_partition(state: Path) -> Path:
    system = FileChangelogSystem({}, state)
    system.ensure_stream(STREAM, 1)
    writer = system.partition(STREAM, 0)
    writer.append(b"k", b"v")
    writer.flush()
    writer.close()
    return system.partition_dir(STREAM, 0)


def test_symlinked_last_segment_is_neither_truncated_nor_appended(state, outside):
    _victim_dir, victim, snapshot = outside
    directory = _written_partition(state)
    segment = sorted(directory.glob("*.log"))[-1]
    segment.unlink()
    segment.symlink_to(victim)  # its content is a "torn tail" to the changelog reader
    before = snapshot()
    with pytest.raises(UnsafePathError) as info:
        FileChangelogSystem({}, state).partition(STREAM, 0)
    assert str(segment) in str(info.value) and "symlink" in str(info.value)
    assert snapshot() == before


def test_symlinked_segment_is_not_read_either(state, outside):
    _victim_dir, victim, snapshot = outside
    directory = _written_partition(state)
    segment = sorted(directory.glob("*.log"))[-1]
    segment.unlink()
    segment.symlink_to(victim)
    with pytest.raises(UnsafePathError):
        list(FileChangelogSystem({}, state).reader(STREAM, 0).read(0))


@pytest.mark.parametrize("name", ["writer.lock", "compact.lock"])
def test_symlinked_partition_lock_creates_nothing_outside(state, outside, name):
    victim_dir, _victim, snapshot = outside
    directory = _written_partition(state)
    lock = directory / name
    lock.unlink(missing_ok=True)
    lock.symlink_to(victim_dir / "created-by-lock")
    before = snapshot()
    system = FileChangelogSystem({}, state)
    with pytest.raises(UnsafePathError):
        if name == "writer.lock":
            system.partition(STREAM, 0)
        else:
            system.compact(STREAM, 0, upto=1)
    assert snapshot() == before


def test_symlinked_stream_metadata_is_refused(state, outside):
    _victim_dir, victim, snapshot = outside
    system = FileChangelogSystem({}, state)
    system.ensure_stream(STREAM, 1)
    meta = system.stream_dir(STREAM) / "stream.json"
    meta.unlink()
    meta.symlink_to(victim)
    with pytest.raises(UnsafePathError):
        system.ensure_stream(STREAM, 1)


@pytest.mark.parametrize("planted", ["changelogs", "changelogs/log", "changelogs/log/0"])
def test_symlinked_changelog_directories_send_nothing_outside(state, outside, planted):
    victim_dir, _victim, snapshot = outside
    link = state / planted
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(victim_dir, target_is_directory=True)
    before = snapshot()
    system = FileChangelogSystem({}, state)
    with pytest.raises(UnsafePathError) as info:
        system.ensure_stream(STREAM, 1)
        system.partition(STREAM, 0)
    assert str(link) in str(info.value)
    assert snapshot() == before


def test_symlinked_checkpoint_lock_creates_nothing_outside(state, outside):
    victim_dir, _victim, snapshot = outside
    store = CheckpointStore(state / "job" / "checkpoints", anchor=state)
    (store.root / "0.lock").symlink_to(victim_dir / "created-by-lock")
    before = snapshot()
    with pytest.raises(UnsafePathError):
        store.lock(0)
    assert snapshot() == before


def test_symlinked_checkpoint_is_neither_read_nor_written_through(state, outside):
    _victim_dir, victim, snapshot = outside
    store = CheckpointStore(state / "job" / "checkpoints", anchor=state)
    (store.root / "0.json").symlink_to(victim)
    before = snapshot()
    with pytest.raises(UnsafePathError):
        store.load(0)
    with pytest.raises(UnsafePathError):
        store.save(Checkpoint(0, generation=1))
    assert snapshot() == before


def test_write_atomic_replaces_a_symlink_instead_of_writing_through_it(tmp_path, outside):
    _victim_dir, victim, snapshot = outside
    target = tmp_path / "file.json"
    target.symlink_to(victim)
    before = snapshot()
    write_atomic(target, b"new")
    assert target.read_bytes() == b"new" and not target.is_symlink()
    assert snapshot() == before


@pytest.mark.parametrize("planted", ["test-job", "test-job/stores", "test-job/checkpoints",
                                     "test-job/stores/counts"])
def test_symlinked_job_directories_are_refused_at_start(state, outside, planted):
    victim_dir, _victim, snapshot = outside
    link = state / planted
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(victim_dir, target_is_directory=True)
    before = snapshot()
    with pytest.raises(UnsafePathError) as info:
        TaskTestDriver("localstate.core.task:StreamTask", stores=KV, state_dir=state)
    assert str(link) in str(info.value) and "what to do" in str(info.value)
    assert snapshot() == before


def test_relative_changelog_path_may_not_leave_the_state_dir(state):
    from localstate.errors import ConfigError

    with pytest.raises(ConfigError) as info:
        TaskTestDriver("localstate.core.task:StreamTask", stores=KV, state_dir=state,
                       changelog_options={"path": "../victim"})
    assert "changelogs.file.path" in str(info.value)
    assert not (state.parent / "victim").exists()
