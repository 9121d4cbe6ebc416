"""Kill -9 in the middle of a run: a real subprocess pushes/pops (or buffers/drains) with periodic
commits and is SIGKILLed several times; each restart recovers like the runtime (local state +
changelog replay [min(L, C), C) + trim of uncommitted records). The final heap / buffer and the
released output must equal those of a run without failure: totally ordered, nothing lost or
duplicated."""

from __future__ import annotations

import importlib.util
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from localstate.runtime.partition.recovery import recover_store

CHILD = Path(__file__).with_name("crash_child.py")
_spec = importlib.util.spec_from_file_location("heap_crash_child", CHILD)
child = importlib.util.module_from_spec(_spec)  # type: ignore[arg-type]
_spec.loader.exec_module(child)  # type: ignore[union-attr]


def start(state: Path, mode: str, seed: int, ops: int, every: int) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(CHILD), str(state), mode, str(seed), str(ops), str(every)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def committed_position(state: Path) -> int:
    try:
        return json.loads((state / "commit.json").read_text())["position"]
    except (FileNotFoundError, ValueError):
        return 0


def final_state(state: Path, mode: str) -> tuple[list[Any], list[Any], int]:
    """Recover the store the runtime's way and return (content in order, committed outputs, position)."""
    commit = child.read_commit(state)
    store, changelog = child.open_store(state, mode)
    recovery = recover_store(store, changelog, commit["offset"], label="check")
    assert recovery.local_offset is not None  # local state was reused, not rebuilt from scratch
    if mode == "topn":
        content = [[e.item, e.score, e.payload] for e in store]
    else:
        content = [[e.timestamp, e.event] for e in store] + [store.watermark, store.next_sequence]
    store.close()
    changelog.close()
    data = (state / "outputs.jsonl").read_bytes()[: commit["outputs"]]
    outputs = [json.loads(line) for line in data.decode().splitlines()]
    return content, outputs, commit["position"]


@pytest.mark.parametrize("mode,ops", [("topn", 12_000), ("reorder", 8_000)])  # >= 4 commits of 400 ops left to kill in
def test_kill9_mid_run_recovers_identically(tmp_path: Path, mode: str, ops: int) -> None:
    seed, every = 7, 400
    reference = tmp_path / "reference"
    proc = start(reference, mode, seed, ops, every)
    assert proc.wait(timeout=120) == 0, proc.stderr.read().decode()  # type: ignore[union-attr]
    expected = final_state(reference, mode)
    assert expected[2] == len(child.workload(mode, seed, ops))

    crashed = tmp_path / "crashed"
    rng = random.Random(seed)
    kills = 0
    for _ in range(4):
        before = committed_position(crashed)
        proc = start(crashed, mode, seed, ops, every)
        deadline = time.monotonic() + 60
        while committed_position(crashed) <= before and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.005)
        time.sleep(rng.uniform(0.0, 0.08))
        if proc.poll() is not None:
            assert proc.returncode == 0, proc.stderr.read().decode()  # type: ignore[union-attr]
            break
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        kills += 1
    else:
        proc = start(crashed, mode, seed, ops, every)
        assert proc.wait(timeout=120) == 0, proc.stderr.read().decode()  # type: ignore[union-attr]
    print(f"{mode}: {kills} kills")
    assert kills >= 1, "the child finished before it could be killed; raise ops"
    got = final_state(crashed, mode)
    assert got == expected
    content, outputs, _ = got
    if mode == "reorder":
        stamps = [ts for ts, _ in outputs]
        assert stamps == sorted(stamps)  # totally ordered
        ids = [event["id"] for _, event in outputs] + [event["id"] for _, event in content[:-2]]
        assert sorted(ids) == list(range(ops))  # nothing lost, nothing duplicated
        assert len(outputs) > ops // 2
    else:
        assert len(content) <= child.TOPN_OPTIONS["capacity"]
        assert [e[1] for e in content] == sorted((e[1] for e in content), reverse=True)
