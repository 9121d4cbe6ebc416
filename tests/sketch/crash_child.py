"""Child process of the kill -9 test: recovers three sketch stores to the last committed batch, then
adds batches forever, committing (flush every store, then record the batch and changelog offsets in
a side file) every few batches. The parent kills it at random points.

Also imported by the test (``apply_batch``, ``open_store``) so the reference run uses the same inputs.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np

from localstate.core.engine import StoreContext
from localstate.core.serdes import BytesSerde, StringSerde
from localstate.engines.sketch import SketchEngineFactory

STORES: dict[str, dict[str, Any]] = {
    "visitors": {"kind": "hll", "precision": 10},
    "seen": {"kind": "bloom", "capacity": 50_000, "error_rate": 0.01},
    "latency": {"kind": "quantiles", "k": 64},
}
NAMES = ("page-a", "page-b", "page-c")
COMMIT_EVERY = 3


def open_store(name: str, directory: Path, changelog: Any, backend: str = "rocksdb") -> Any:
    factory = SketchEngineFactory()
    options = factory.validate_options(name, {**STORES[name], "backend": backend})
    directory.mkdir(parents=True, exist_ok=True)
    return factory.create(StoreContext("crash-job", name, 0, directory, options, StringSerde(), BytesSerde(),
                                       changelog))


def apply_batch(stores: dict[str, Any], batch: int) -> None:
    """The deterministic inputs of one batch."""
    rng = np.random.default_rng(1000 + batch)
    sketch = NAMES[batch % len(NAMES)]
    users = [f"user-{int(u)}" for u in rng.integers(0, 200_000, 1500)]
    stores["visitors"].add_many(sketch, users)
    stores["visitors"].add(sketch, int(rng.integers(0, 10**9)))
    stores["seen"].add_many(sketch, users[:700])
    stores["seen"].add(NAMES[0], f"single-{batch}")
    stores["latency"].add_many(sketch, rng.exponential(size=800))
    stores["latency"].add(NAMES[0], float(batch))


def read_side(path: Path) -> dict[str, Any]:
    if not path.exists():
        return {"batch": -1, "offsets": {name: 0 for name in STORES}}
    return json.loads(path.read_text())


def write_side(path: Path, state: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w") as f:
        json.dump(state, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def main(root: str) -> None:
    from localstate.changelog.file import FileChangelogPartition
    from localstate.core.recovery import recover_store

    base = Path(root)
    side = base / "committed.json"
    committed = read_side(side)
    changelogs = {name: FileChangelogPartition(base / "changelog" / name, name, 0) for name in STORES}
    stores = {name: open_store(name, base / "state" / name, changelogs[name]) for name in STORES}
    for name, store in stores.items():
        recover_store(store, changelogs[name], committed["offsets"][name], label=name)
    batch = committed["batch"] + 1
    while True:
        apply_batch(stores, batch)
        if batch % COMMIT_EVERY == COMMIT_EVERY - 1:
            offsets = {}
            for name, store in stores.items():
                store.flush()
                offsets[name] = changelogs[name].end_offset()
            write_side(side, {"batch": batch, "offsets": offsets})
        batch += 1


if __name__ == "__main__":
    main(sys.argv[1])
