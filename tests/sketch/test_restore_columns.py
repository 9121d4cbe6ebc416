"""The sketch stores' column restore path (``restore_columns``, what recovery uses) gives the same
sketches as the record path, for fresh stores and for stores with sketches loaded in memory."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from localstate.changelog.memory import MemoryChangelogPartition
from localstate.core.changelog import RecordColumns
from localstate.core.engine import ColumnRestore
from tests.sketch.test_store import loaded_past_a_checkpoint, open_store


def _columns(changelog: MemoryChangelogPartition, start: int, size: int = 3) -> list[RecordColumns]:
    """The records from ``start`` as column runs of ``size`` records (many run boundaries)."""
    records = list(changelog.read(start))
    return [RecordColumns([r.key for r in part], [r.value for r in part], part[-1].offset + 1)
            for part in (records[i:i + size] for i in range(0, len(records), size))]


@pytest.mark.parametrize("backend", ["rocksdb", "lmdb", "memory"])
def test_fresh_store_restored_from_columns_equals_records(tmp_path: Path, backend: str) -> None:
    changelog = MemoryChangelogPartition()
    store = open_store(tmp_path / "a", changelog, kind="hll", precision=6, backend=backend)
    for round_ in range(3):
        store.add_many("p", [f"u{round_}-{i}" for i in range(300)])
        store.add_many("q", [f"v{round_}-{i}" for i in range(50)])
        store.flush()
    expected = {n: store.registers(n) for n in ("p", "q")}
    store.close()
    by_columns = open_store(tmp_path / "c", changelog, kind="hll", precision=6, backend=backend)
    assert isinstance(by_columns, ColumnRestore)
    by_columns.restore_columns(_columns(changelog, 0))
    by_columns.flush()
    by_records = open_store(tmp_path / "r", changelog, kind="hll", precision=6, backend=backend)
    by_records.restore(changelog.read(0))
    by_records.flush()
    for name, registers in expected.items():
        assert np.array_equal(by_columns.registers(name), registers)
        assert np.array_equal(by_records.registers(name), registers)
    by_columns.close()
    by_records.close()


def test_loaded_sketch_gets_the_restored_units(tmp_path: Path) -> None:
    """A sketch loaded in memory takes the last restored value of each unit (the runtime's trim)."""
    changelog = MemoryChangelogPartition()
    store, committed, _, values = loaded_past_a_checkpoint(tmp_path, changelog)
    keys = sorted(values)
    store.restore_columns([RecordColumns(keys[:2], [values[k] for k in keys[:2]], 0),
                           RecordColumns(keys[2:], [values[k] for k in keys[2:]], 0)])
    assert np.array_equal(store.registers("s"), committed)
    store.flush()
    store.close()
    again = open_store(tmp_path, changelog, kind="hll", precision=6)
    assert np.array_equal(again.registers("s"), committed)
    again.close()
