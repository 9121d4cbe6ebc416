"""Child process for the kill -9 tests: runs a deterministic heap workload with periodic commits.

    python crash_child.py STATE_DIR MODE SEED OPS COMMIT_EVERY

A commit is: ``store.flush()``, then outputs appended to ``outputs.jsonl`` and fsynced, then the
side file ``commit.json`` ({"position", "offset", "outputs"}) replaced atomically. On start the
child recovers the store exactly like the runtime (``localstate.runtime.partition.recovery.recover_store`` with
the committed offset: replay ``[min(L, C), C)``, trim records after C, flush), truncates the output
file to its committed length, and resumes at the committed input position.
"""

from __future__ import annotations

import json
import os
import random
import sys
from pathlib import Path
from typing import Any

from localstate.changelog.file.partition import FileChangelogPartition
from localstate.core.engine import StoreContext
from localstate.runtime.partition.recovery import recover_store
from localstate.core.serdes import JsonSerde, StringSerde
from localstate.engines.heap import HeapEngineFactory

TOPN_OPTIONS = {"order": "max", "capacity": 300, "backend": "rocksdb"}
REORDER_OPTIONS = {"kind": "reorder", "max_lateness": 40, "late_policy": "drop", "backend": "rocksdb"}


def workload(mode: str, seed: int, ops: int) -> list[tuple]:
    """The deterministic input: one operation per position."""
    rng = random.Random(seed)
    result: list[tuple] = []
    for i in range(ops):
        if mode == "topn":
            r = rng.random()
            item = f"item{rng.randrange(1500)}"
            if r < 0.75:
                result.append(("push", item, rng.randrange(100) / 4, {"i": i}))
            elif r < 0.85:
                result.append(("remove", item))
            else:
                result.append(("pop",))
        else:
            # Out of order by up to 39 < max_lateness: no event is ever late, none may be lost.
            result.append(("push", {"id": i}, i - rng.randrange(40)))
            if i % 25 == 24:
                result.append(("drain",))
    return result


def open_store(state: Path, mode: str) -> tuple[Any, FileChangelogPartition]:
    changelog = FileChangelogPartition(state / "changelog", "heap-changelog", 0)
    factory = HeapEngineFactory()
    options = factory.validate_options("crash", TOPN_OPTIONS if mode == "topn" else REORDER_OPTIONS)
    directory = state / "store"
    directory.mkdir(parents=True, exist_ok=True)
    context = StoreContext(job="crash", store="crash", partition=0, directory=directory, options=options,
                           key_serde=StringSerde(), value_serde=JsonSerde(), changelog=changelog)
    return factory.create(context), changelog


def read_commit(state: Path) -> dict[str, int]:
    path = state / "commit.json"
    if not path.exists():
        return {"position": 0, "offset": 0, "outputs": 0}
    return json.loads(path.read_text())


def apply(store: Any, op: tuple) -> list[Any]:
    """Run one operation; return what it released (popped entries, drained events)."""
    if op[0] == "push":
        if len(op) == 4:
            store.push(op[1], op[2], op[3])
        else:
            store.push(op[1], op[2])
        return []
    if op[0] == "remove":
        store.remove(op[1])
        return []
    if op[0] == "pop":
        entry = store.pop()
        return [] if entry is None else [[entry.item, entry.score, entry.payload]]
    return [[e.timestamp, e.event] for e in store.drain()]


def main(argv: list[str]) -> int:
    state, mode, seed, ops, commit_every = Path(argv[0]), argv[1], int(argv[2]), int(argv[3]), int(argv[4])
    state.mkdir(parents=True, exist_ok=True)
    committed = read_commit(state)
    store, changelog = open_store(state, mode)
    recover_store(store, changelog, committed["offset"], label="crash[0]")
    out_path = state / "outputs.jsonl"
    with open(out_path, "a+b") as out:
        out.truncate(committed["outputs"])
    pending: list[str] = []
    steps = workload(mode, seed, ops)
    position = committed["position"]
    while position < len(steps):
        for row in apply(store, steps[position]):
            pending.append(json.dumps(row))
        position += 1
        if position % commit_every == 0 or position == len(steps):
            store.flush()
            offset = changelog.end_offset()
            with open(out_path, "ab") as out:
                if pending:
                    out.write(("\n".join(pending) + "\n").encode())
                out.flush()
                os.fsync(out.fileno())
                size = out.tell()
            pending = []
            tmp = state / "commit.json.tmp"
            tmp.write_text(json.dumps({"position": position, "offset": offset, "outputs": size}))
            with open(tmp, "rb") as handle:
                os.fsync(handle.fileno())
            os.replace(tmp, state / "commit.json")
    store.close()
    changelog.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
