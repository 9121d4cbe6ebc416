"""The engine contract suite for kv stores with ``write_behind = true`` (each commit's backend write
on a background thread once the changelog is flushed), over every backend, with and without spills;
the crash check kills children mid-flush, including while a background write is running."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from contract_adapters import KvAdapter

from localstate.testing.contract import ContractSuite, EngineAdapter, check_crash


class WriteBehindKvAdapter(KvAdapter):
    """A kv store with write-behind on (the crash child rebuilds it from ``params``)."""

    def __init__(self, backend: str, write_batch_size: int | None = None, bulk: int = 0,
                 restore_batch_size: int | None = None) -> None:
        super().__init__(backend, write_batch_size=write_batch_size, bulk=bulk, restore_batch_size=restore_batch_size)

    def options(self) -> dict[str, Any]:
        return {**super().options(), "write_behind": True}


ADAPTERS: list[EngineAdapter] = [
    WriteBehindKvAdapter("rocksdb"),
    WriteBehindKvAdapter("lmdb", restore_batch_size=2),
    WriteBehindKvAdapter("memory"),
    WriteBehindKvAdapter("lmdb", write_batch_size=3),
]


@pytest.fixture(params=ADAPTERS, ids=lambda adapter: f"write_behind-{adapter.name}")
def adapter(request: pytest.FixtureRequest) -> EngineAdapter:
    return request.param


class TestWriteBehindKv(ContractSuite):
    """Every contract check for write-behind kv stores."""

    test_crash = None  # one child for all adapters below


def test_crash_write_behind(tmp_path: Path) -> None:
    check_crash([WriteBehindKvAdapter("rocksdb", bulk=3000), WriteBehindKvAdapter("lmdb", bulk=3000)],
                tmp_path, seed=3, kills=4)
