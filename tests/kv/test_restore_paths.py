"""The bulk restore path (``read_columns`` -> ``restore_columns`` -> one dict per bulk run -> the
backend's bulk load) against the record path and a model, on random histories; its errors (damaged
changelog frames, keys a backend cannot hold) and a restore killed half way (SIGKILL), then reopened.

Tiny sizes everywhere (segments of a few hundred bytes, decode batches and file reads of a few
records, bulk runs of a few keys, one-key restore chunks) so that every boundary is crossed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from localstate.changelog.file import FileChangelogSystem
from localstate.changelog.file import partition as file_partition
from localstate.changelog.file.format import list_segments, segment_name
from localstate.core import backend as backend_module
from localstate.runtime.partition.recovery import recover_store
from localstate.errors import ChangelogCorruptError, RestoreError
from bench.restore import RecordPath
from tests.kv.test_bulk_restore import _engine

BACKENDS = ["rocksdb", "lmdb", "memory"]


def _state(engine) -> dict[bytes, bytes]:  # noqa: ANN001
    with engine.all() as items:
        return dict(items)


@pytest.fixture
def tiny_boundaries() -> None:
    """Decode batches of ~2 records, file reads of ~4, bulk runs of 3 keys (the process-wide
    settings; restored by hand because hypothesis runs many examples per fixture)."""
    saved = (file_partition._BATCH_BYTES, file_partition._CHUNK, backend_module.KVBackend.bulk_run_keys)
    file_partition._BATCH_BYTES, file_partition._CHUNK = 60, 160
    backend_module.KVBackend.bulk_run_keys = 3
    yield
    file_partition._BATCH_BYTES, file_partition._CHUNK, backend_module.KVBackend.bulk_run_keys = saved


#: One history step: (key index, value) with None a delete, or "flush".
_STEP = st.one_of(st.tuples(st.integers(0, 11), st.one_of(st.none(), st.binary(min_size=0, max_size=40))),
                  st.just("flush"))


@pytest.mark.parametrize("backend", BACKENDS)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(history=st.lists(_STEP, min_size=1, max_size=80), split=st.floats(0, 1))
def test_column_path_equals_record_path_and_model(tmp_path_factory: pytest.TempPathFactory, tiny_boundaries: None,
                                                  backend: str, history: list, split: float) -> None:
    """Restored in two steps (a full restore of the first part of the history, then, after a reopen,
    a replay of the rest over that local state), through either path: the model's state and the
    changelog's end as local offset, both times."""
    root = tmp_path_factory.mktemp("restore")
    system = FileChangelogSystem({"fsync": False, "segment_bytes": 300}, root / "log")
    changelog = system.partition("c", 0)
    model: dict[bytes, bytes] = {}
    middle = int(len(history) * split)
    for part in (history[:middle], history[middle:]):
        for step in part:
            if step == "flush":
                changelog.flush()
                continue
            index, value = step
            key = b"key-%02d" % index
            changelog.append(key, value)
            if value is None:
                model.pop(key, None)
            else:
                model[key] = value
        end = changelog.flush()
        for path in ("columns", "records"):
            engine = _engine(root / path, backend, changelog, restore_batch_size=1)
            recover_store(engine if path == "columns" else RecordPath(engine), changelog, end, label="t")
            assert _state(engine) == model, path
            assert engine.local_offset() == end
            engine.close()
    changelog.close()


@pytest.mark.parametrize("backend", BACKENDS)
def test_corrupt_frame_during_restore_names_segment_and_offset(tmp_path: Path, backend: str) -> None:
    """A damaged record in the middle of the log stops the bulk restore with ChangelogCorruptError
    naming the segment file and the offset; the store's recorded offset does not move."""
    system = FileChangelogSystem({"fsync": False, "segment_bytes": 2000}, tmp_path / "log")
    changelog = system.partition("c", 0)
    for i in range(200):
        changelog.append(b"key-%03d" % (i % 37), b"value-%05d" % i)
    changelog.flush()
    end = changelog.flushed_end()
    directory = system.partition_dir("c", 0)
    segment = directory / segment_name(list_segments(directory)[2])
    data = bytearray(segment.read_bytes())
    data[len(data) // 2] ^= 0x5A  # inside some record of a sealed segment; valid records follow
    segment.write_bytes(bytes(data))
    engine = _engine(tmp_path / "store", backend, changelog)
    with pytest.raises(ChangelogCorruptError) as info:
        recover_store(engine, changelog, end, label="t")
    assert info.value.context["segment"] == str(segment)
    first = list_segments(directory)[2]
    assert first <= info.value.context["offset"] < list_segments(directory)[3]
    assert engine.local_offset() is None  # nothing recorded: the next open rebuilds from offset 0
    engine.close()
    changelog.close()


@pytest.mark.parametrize("key", [b"", b"k" * 600], ids=["empty", "600 bytes"])
def test_key_lmdb_cannot_hold_is_a_restore_error(tmp_path: Path, key: bytes) -> None:
    """A changelog value under a key LMDB cannot hold (empty, or over its 511-byte limit) makes the
    restore fail with RestoreError naming the store and key size; a tombstone of such a key is
    harmless (the key cannot exist) and is skipped."""
    system = FileChangelogSystem({"fsync": False}, tmp_path / "log")
    changelog = system.partition("c", 0)
    changelog.append_many([(b"a", b"1"), (key, None), (b"b", b"2")])
    changelog.flush()
    engine = _engine(tmp_path / "ok", "lmdb", changelog)
    recover_store(engine, changelog, changelog.flushed_end(), label="t")
    assert _state(engine) == {b"a": b"1", b"b": b"2"}
    engine.close()
    changelog.append(key, b"value")
    changelog.flush()
    engine = _engine(tmp_path / "bad", "lmdb", changelog)
    with pytest.raises(RestoreError) as info:
        recover_store(engine, changelog, changelog.flushed_end(), label="t")
    assert info.value.context["store"] == "s" and info.value.context["key_size"] == len(key)
    assert "rocksdb" in (info.value.hint or "")
    assert engine.local_offset() is None
    engine.close()
    # RocksDB holds any key size: the same changelog restores
    engine = _engine(tmp_path / "rocks", "rocksdb", changelog)
    recover_store(engine, changelog, changelog.flushed_end(), label="t")
    assert engine.get(key) == b"value"
    engine.close()
    changelog.close()


_CHILD = r"""
import sys
from pathlib import Path
from localstate.changelog.file import FileChangelogSystem
from localstate.core import backend as backend_module
from localstate.core.engine import StoreContext
from localstate.runtime.partition.recovery import recover_store
from localstate.core.serdes import BytesSerde
from localstate.engines.kv import KeyValueEngineFactory

root, backend, checkpoint = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
backend_module.KVBackend.bulk_run_keys = 50
system = FileChangelogSystem({"fsync": False}, root / "log")
changelog = system.partition("c", 0)
factory = KeyValueEngineFactory()
options = factory.validate_options("s", {"backend": backend})
context = StoreContext(job="j", store="s", partition=0, directory=root / "store", options=options,
                       key_serde=BytesSerde(), value_serde=BytesSerde(), changelog=changelog)
engine = factory.create(context)
original = engine.backend._bulk_load
runs = 0

def chunks_then_report(chunks):
    def counted():
        global runs
        for chunk in chunks:
            yield chunk
            runs += 1
            if runs == 3:  # three runs are in the backend: wait here to be killed
                print("loading", flush=True)
                sys.stdin.readline()
    original(counted())

engine.backend._bulk_load = chunks_then_report
recover_store(engine, changelog, checkpoint, label="child")
print("done", flush=True)
"""


@pytest.mark.parametrize("backend", ["rocksdb", "lmdb"])
def test_restore_killed_half_way_then_reopened_is_exact(tmp_path: Path, backend: str) -> None:
    """A store at offset C1 replays [C1, C2) in a child process that is SIGKILLed while bulk runs
    are being loaded. Reopened: the recorded offset is still C1 (it moves only with the flush that
    ends a restore), and recovering again gives exactly the state at C2."""
    system = FileChangelogSystem({"fsync": False}, tmp_path / "log")
    changelog = system.partition("c", 0)
    model: dict[bytes, bytes] = {}

    def log(start: int, count: int) -> None:
        for i in range(start, start + count):
            key, value = b"key-%04d" % (i * 7919 % 1500), None if i % 5 == 0 else b"v%06d" % i
            changelog.append(key, value)
            if value is None:
                model.pop(key, None)
            else:
                model[key] = value
        changelog.flush()

    log(0, 1000)
    first = changelog.flushed_end()
    at_first = dict(model)
    engine = _engine(tmp_path / "store", backend, changelog)
    recover_store(engine, changelog, first, label="t")
    engine.close()
    log(1000, 4000)
    second = changelog.flushed_end()
    changelog.close()  # the child is the writer now (recovery ends with a flush)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(Path.cwd()), os.environ.get("PYTHONPATH")])))
    child = subprocess.Popen([sys.executable, "-c", _CHILD, str(tmp_path), backend, str(second)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        line = child.stdout.readline()
        assert line.strip() == "loading", child.stderr.read()
        child.send_signal(signal.SIGKILL)
        assert child.wait() == -signal.SIGKILL
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        child.stdin.close()
        child.stdout.close()
        child.stderr.close()
    changelog = system.partition("c", 0)
    assert changelog.flushed_end() == second
    engine = _engine(tmp_path / "store", backend, changelog)
    assert engine.local_offset() == first
    assert _state(engine) != at_first  # killed half way: some runs of the replay had landed
    recovery = recover_store(engine, changelog, second, label="t")
    assert recovery.local_offset == first and recovery.replayed == second - first
    assert _state(engine) == model
    engine.close()
    engine = _engine(tmp_path / "store", backend, changelog)
    assert engine.local_offset() == second and _state(engine) == model
    engine.close()
    changelog.close()
