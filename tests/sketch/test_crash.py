"""kill -9 a real process that adds to sketch stores and commits periodically; the restarted stores
must equal a failure-free run over exactly the committed inputs (registers, words, serialised KLL)."""

from __future__ import annotations

import importlib.util
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from localstate.changelog.file import FileChangelogPartition
from localstate.changelog.memory import MemoryChangelogPartition
from localstate.core.recovery import recover_store

HERE = Path(__file__).parent
_spec = importlib.util.spec_from_file_location("sketch_crash_child", HERE / "crash_child.py")
child = importlib.util.module_from_spec(_spec)
assert _spec.loader is not None
_spec.loader.exec_module(child)


def _reference(batches: int, tmp: Path) -> dict:
    """Failure-free run on the memory backend over batches 0..batches-1."""
    stores = {name: child.open_store(name, tmp / "ref" / name, MemoryChangelogPartition(), backend="memory")
              for name in child.STORES}
    for batch in range(batches):
        child.apply_batch(stores, batch)
    return stores


def _assert_identical(stores: dict, reference: dict) -> None:
    for sketch in child.NAMES:
        assert np.array_equal(stores["visitors"].registers(sketch), reference["visitors"].registers(sketch)), sketch
        assert np.array_equal(stores["seen"].words(sketch), reference["seen"].words(sketch)), sketch
        assert stores["latency"].serialized(sketch) == reference["latency"].serialized(sketch), sketch


def _wait_for_commit(path: Path, after: int, process: subprocess.Popen, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if child.read_side(path)["batch"] > after:
            return
        if process.poll() is not None:
            raise AssertionError(f"child exited early with {process.returncode}: {process.stderr.read().decode()}")
        time.sleep(0.01)
    raise AssertionError("child made no commit in time")


@pytest.mark.slow
def test_kill9_at_random_points_then_restore_is_bit_identical(tmp_path: Path) -> None:
    rng = random.Random(20240607)
    side = tmp_path / "committed.json"
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    kills = 0
    for _round in range(3):
        before = child.read_side(side)["batch"]
        process = subprocess.Popen([sys.executable, str(HERE / "crash_child.py"), str(tmp_path)],
                                   stderr=subprocess.PIPE, env=env)
        try:
            _wait_for_commit(side, before, process)
            time.sleep(rng.uniform(0.0, 0.4))  # land anywhere: mid-batch, mid-flush, between stores
        finally:
            os.kill(process.pid, signal.SIGKILL)
            process.wait()
        kills += 1
        assert process.returncode == -signal.SIGKILL
    committed = child.read_side(side)
    assert committed["batch"] >= 2 and kills == 3

    changelogs = {name: FileChangelogPartition(tmp_path / "changelog" / name, name, 0) for name in child.STORES}
    stores = {name: child.open_store(name, tmp_path / "state" / name, changelogs[name]) for name in child.STORES}
    try:
        for name, store in stores.items():
            local = store.local_offset()
            assert local is None or local <= changelogs[name].end_offset()
            recovery = recover_store(store, changelogs[name], committed["offsets"][name], label=name)
            assert recovery.checkpoint_offset == committed["offsets"][name]
        reference = _reference(committed["batch"] + 1, tmp_path)
        _assert_identical(stores, reference)
        # and the recovered stores keep evolving exactly like the reference
        next_batch = committed["batch"] + 1
        child.apply_batch(stores, next_batch)
        child.apply_batch(reference, next_batch)
        _assert_identical(stores, reference)
    finally:
        for name in child.STORES:
            stores[name].close()
            changelogs[name].close()
