"""Write-behind crash safety: a process killed after a commit's changelog fsync but before its
backend write lands (the write is held in the background thread) restores exactly the committed
state: the backend reopens at the previous commit's offset and recovery replays the tail."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from localstate.changelog.file import FileChangelogSystem
from localstate.core.engine import StoreContext
from localstate.runtime.partition.recovery import recover_store
from localstate.core.serdes import IntSerde, StringSerde
from localstate.engines.kv import KeyValueEngineFactory

CHILD = Path(__file__).with_name("_write_behind_child.py")
N_KEYS = 3000


def run_child_until_blocked(workdir: Path, backend: str) -> list[int]:
    """The committed end offsets the child printed, once its second backend write hangs; then SIGKILL."""
    proc = subprocess.Popen([sys.executable, str(CHILD), str(workdir), backend, str(N_KEYS)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    committed: list[int] = []
    try:
        assert proc.stdout is not None
        blocked = False
        for line in proc.stdout:
            if line.startswith("committed"):
                committed.append(int(line.split()[1]))
            blocked = blocked or line.startswith("blocked")
            if blocked and len(committed) == 2:
                break
        else:
            raise AssertionError(f"child ended early: {proc.stderr.read() if proc.stderr else ''}")
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()
    return committed


@pytest.mark.parametrize("backend", ["rocksdb", "lmdb"])
def test_kill_between_changelog_fsync_and_backend_write(tmp_path: Path, backend: str) -> None:
    first, second = run_child_until_blocked(tmp_path, backend)
    assert (first, second) == (N_KEYS, 2 * N_KEYS)

    system = FileChangelogSystem({"path": str(tmp_path / "changelog"), "fsync": True}, tmp_path)
    changelog = system.partition("wb", 0)
    assert changelog.end_offset() == second  # round 2 was durable before flush() returned
    factory = KeyValueEngineFactory()
    options = factory.validate_options("wb", {"backend": backend, "write_behind": True})
    kv = factory.create(StoreContext("job", "wb", 0, tmp_path / "store", options, StringSerde(), IntSerde(),
                                     changelog))
    try:
        # the backend never received round 2: it is exactly at round 1
        assert kv.local_offset() == first
        assert dict(kv.all()) == {f"key-{i:05d}": 1 for i in range(N_KEYS)}
        recovery = recover_store(kv, changelog, second, label="write-behind crash test")
        assert (recovery.status, recovery.replayed) == ("replayed", N_KEYS)
        expected = {f"key-{i:05d}": 2 for i in range(N_KEYS) if i % 3}
        assert dict(kv.all()) == expected
        assert kv.local_offset() == second
    finally:
        kv.close()
        changelog.close()
    # and the recovered state is local now: a reopen needs no replay
    changelog = system.partition("wb", 0)
    kv = factory.create(StoreContext("job", "wb", 0, tmp_path / "store", options, StringSerde(), IntSerde(),
                                     changelog))
    try:
        assert kv.local_offset() == second
        assert dict(kv.all()) == expected
    finally:
        kv.close()
        changelog.close()
