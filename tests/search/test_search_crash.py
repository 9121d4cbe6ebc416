"""Kill -9 a real process that indexes and flushes; recover; compare with a reference index."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from localstate.changelog.memory import MemoryChangelogPartition
from search_support import durable_changelog, open_engine, read_checkpoint, recover, state_at, write_checkpoint

WORKER = Path(__file__).parent / "crash_worker.py"
QUERIES = ["function", "return value", "title:module", "body:\"the file\"", "year:[2000 TO 2010] AND data",
           "module:os", "socket OR thread", "+string -unicode", "class", "*"]


def run_and_kill(workdir: Path, mode: str, seed: int, round_: int, min_offset: int) -> None:
    proc = subprocess.Popen([sys.executable, str(WORKER), str(workdir), mode, str(seed), str(round_)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        while read_checkpoint(workdir / "checkpoint") < min_offset:
            if proc.poll() is not None:
                raise AssertionError(f"worker died: {proc.stderr.read().decode()[-2000:]}")
            if time.monotonic() > deadline:
                raise AssertionError("worker made no progress")
            time.sleep(0.01)
        time.sleep(random.Random(seed + round_).uniform(0.0, 0.2))  # land anywhere in the work cycle
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    assert proc.returncode == -signal.SIGKILL


def reference(tmp: Path, committed: dict[bytes, bytes]):
    ref = open_engine(tmp, MemoryChangelogPartition())
    for key, value in committed.items():
        ref.add(key.decode(), json.loads(value))
    ref.flush()
    return ref


# "mixed" (adds and deletes) in the default run; adds alone are the slow soak (`-m slow`).
@pytest.mark.parametrize("mode", [pytest.param("add", marks=pytest.mark.slow), "mixed"])
def test_kill9_then_restore_matches_reference(tmp_path: Path, mode: str) -> None:
    seed = 20261122
    rounds = []
    ranked_checks = 0
    for round_ in range(1, 4):
        workdir = tmp_path / "work"
        workdir.mkdir(exist_ok=True)
        run_and_kill(workdir, mode, seed, round_, min_offset=150 * round_)
        checkpoint = read_checkpoint(workdir / "checkpoint")
        changelog = durable_changelog(workdir / "changelog")
        engine = open_engine(workdir / "store", changelog)  # the writer lock died with the worker
        committed = state_at(changelog.read(0, checkpoint))
        info = recover(engine, changelog, checkpoint)
        write_checkpoint(workdir / "checkpoint", engine.local_offset())  # the runtime's new checkpoint
        rounds.append(info)
        assert engine.local_offset() == changelog.end_offset()
        assert state_at(changelog.read()) == committed  # trims neutralised any post-checkpoint tail
        ref = reference(tmp_path / f"ref{round_}", committed)
        assert engine.count("*") == ref.count("*") == len(committed)
        for key, value in committed.items():
            assert engine.get(key.decode()) == ref.get(key.decode())
        if mode == "mixed":
            for doc_id in (f"d{i:03d}" for i in range(400)):
                if doc_id.encode() not in committed:  # deleted or never committed: never comes back
                    assert engine.get(doc_id) is None
        for q in QUERIES:
            got = engine.search(q, limit=25)
            want = ref.search(q, limit=25)
            assert {h.doc_id for h in engine.search(q, 10_000)} == {h.doc_id for h in ref.search(q, 10_000)}, q
            if mode == "add" and info["local"] is not None and info["local"] <= checkpoint:
                # Same documents and no deleted ones: ids, order and BM25 scores are identical.
                ranked_checks += 1
                assert [(h.doc_id, h.score, h.fields) for h in got] == [(h.doc_id, h.score, h.fields) for h in want], q
        ref.close()
        engine.close()
        changelog.close()
    print(mode, rounds)
    assert all(r["checkpoint"] > 0 for r in rounds)
    if mode == "add":
        assert ranked_checks >= len(QUERIES)  # the exact-ranking comparison really ran
