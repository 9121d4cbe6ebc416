"""SIGKILL in the middle of a flush leaves data and local offset in agreement (rocksdb, lmdb)."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from localstate.changelog.memory import MemoryChangelogPartition
from localstate.core.engine import StoreContext
from localstate.core.serdes import BytesSerde
from localstate.engines.kv import KeyValueEngineFactory

CHILD = Path(__file__).with_name("_flush_child.py")
N_KEYS = 20_000


def kill_during_flush(directory: Path, backend: str, rng: random.Random) -> int:
    """Run the child until its second+ flush starts, SIGKILL it a random moment later; return the
    last round whose flush the child had started when the kill landed (on a loaded machine the
    child may be rounds ahead of the line this process has read)."""
    proc = subprocess.Popen([sys.executable, str(CHILD), str(directory), backend, str(N_KEYS)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        target = rng.randint(2, 3)
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith("flushing") and int(line.split()[1]) >= target:
                time.sleep(rng.uniform(0, 0.12))
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait()
                # What the child printed before it died is still in the pipe.
                started = [int(rest.split()[1]) for rest in proc.stdout.read().splitlines()
                           if rest.startswith("flushing")]
                return max([int(line.split()[1]), *started])
        raise AssertionError(f"child ended early: {proc.stderr.read() if proc.stderr else ''}")
    finally:
        proc.kill()
        proc.wait()


def check_consistent(directory: Path, backend: str) -> int:
    factory = KeyValueEngineFactory()
    options = factory.validate_options("crash", {"backend": backend})
    ctx = StoreContext("job", "crash", 0, directory, options, BytesSerde(), BytesSerde(),
                       MemoryChangelogPartition())
    with factory.create(ctx) as kv:
        offset = kv.local_offset()
        assert offset is not None and offset % N_KEYS == 0, offset
        round_ = offset // N_KEYS
        rounds = {value[:8] for _, value in kv.all()}
        count = sum(1 for _ in kv.all())
        assert rounds == {b"%08d" % round_}, (offset, sorted(rounds))   # never a mix of two flushes
        assert count == N_KEYS
        return round_


def run(tmp_path: Path, backend: str, kills: int, seed: int) -> None:
    rng = random.Random(seed)
    outcomes = []
    for attempt in range(kills):
        directory = tmp_path / f"{backend}-{attempt}"
        directory.mkdir()
        started = kill_during_flush(directory, backend, rng)
        round_ = check_consistent(directory, backend)
        assert round_ in (started - 1, started)   # the previous or the new offset
        outcomes.append(round_ == started)
    print(f"{backend}: kills landing after the flush committed: {sum(outcomes)}/{len(outcomes)}")


@pytest.mark.parametrize("backend", ["rocksdb", "lmdb"])
def test_sigkill_during_flush(tmp_path: Path, backend: str) -> None:
    run(tmp_path, backend, kills=2, seed=42)


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["rocksdb", "lmdb"])
def test_sigkill_during_flush_many(tmp_path: Path, backend: str) -> None:
    run(tmp_path, backend, kills=10, seed=7)
