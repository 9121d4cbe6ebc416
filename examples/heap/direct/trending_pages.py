"""Trending pages: the top-N most viewed pages per one-minute window, kept in a changelog-backed
heap store (``engine = "heap"``), driven directly (no runtime, no Spark).

    python examples/heap/direct/trending_pages.py [STATE_DIR]

Every view pushes ``page -> views so far in this window``; at the end of a window the top 3 are
printed and the store is cleared. Each commit (``flush()``) logs one record per changed page, not
one per view. Halfway through, the store is closed without flushing (a crash) and reopened: local
state plus the changelog bring it back to the last commit, and the replayed views give the same
result as a run without a crash.
"""

from __future__ import annotations

import random
import sys
import tempfile
from pathlib import Path

from localstate.changelog.file import FileChangelogPartition
from localstate.core.engine import StoreContext
from localstate.runtime.partition.recovery import recover_store
from localstate.core.serdes import StringSerde
from localstate.engines.heap import HeapEngineFactory

WINDOW = 60.0


def open_store(state: Path) -> tuple[object, FileChangelogPartition]:
    factory = HeapEngineFactory()
    options = factory.validate_options("trending", {"order": "max", "capacity": 1000})
    changelog = FileChangelogPartition(state / "changelog", "trending-changelog", 0)
    directory = state / "store"
    directory.mkdir(parents=True, exist_ok=True)
    context = StoreContext(job="trending", store="trending", partition=0, directory=directory, options=options,
                           key_serde=StringSerde(), value_serde=StringSerde(), changelog=changelog)
    return factory.create(context), changelog


def views(seed: int = 3) -> list[tuple[float, str]]:
    """Synthetic page views over 5 minutes; the popular page changes every minute."""
    rng = random.Random(seed)
    pages = [f"/page/{i}" for i in range(20)]
    out = []
    for second in range(300):
        hot = pages[second // 60 * 3]
        for _ in range(10):
            out.append((float(second), hot if rng.random() < 0.3 else rng.choice(pages)))
    return out


def run(state: Path, crash_at: int | None = None) -> list[list[tuple[str, float]]]:
    store, changelog = open_store(state)
    recover_store(store, changelog, changelog.end_offset(), label="trending[0]")
    events = views()
    results: list[list[tuple[str, float]]] = []
    window_end = WINDOW
    committed = 0  # input position of the last commit (a real job keeps it in its checkpoint)
    i = 0
    while i < len(events):
        ts, page = events[i]
        if ts >= window_end:
            results.append([(e.item, e.score) for e in store.top(3)])
            store.clear()
            window_end += WINDOW
        store.push(page, (store.score(page) or 0.0) + 1.0)
        i += 1
        if i % 500 == 0:
            store.flush()  # commit
            committed = i
        if i == crash_at:
            print(f"-- crash after {i} views (last commit at {committed}); reopening")
            store.close()  # no flush: uncommitted views are lost...
            changelog.close()
            store, changelog = open_store(state)
            recovery = recover_store(store, changelog, changelog.end_offset(), label="trending[0]")
            print(f"   recovered: local offset {recovery.local_offset}, replayed {recovery.replayed} records")
            i = committed  # ...and are processed again from the committed position
            window_end = (events[i][0] // WINDOW + 1) * WINDOW
            results = results[: int(events[i][0] // WINDOW)]
            crash_at = None
    results.append([(e.item, e.score) for e in store.top(3)])
    store.flush()
    store.close()
    changelog.close()
    return results


def main(argv: list[str]) -> int:
    root = Path(argv[0]) if argv else Path(tempfile.mkdtemp(prefix="trending-"))
    clean = run(root / "clean")
    crashed = run(root / "crashed", crash_at=1730)
    for minute, top in enumerate(crashed):
        print(f"minute {minute}: " + ", ".join(f"{page} ({views:.0f})" for page, views in top))
    assert crashed == clean, "a crash must not change the result"
    print("same result as the run without a crash")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
