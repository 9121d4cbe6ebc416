"""Every check of the engine contract suite (localstate.core.contract) for every built-in engine."""

from __future__ import annotations

from localstate.core.contract import ContractSuite


class TestBuiltinEngines(ContractSuite):
    """kv x {rocksdb, lmdb, memory, rocksdb spilling}, heap topn/reorder x backends, sketch kinds,
    search; the ``adapter`` fixture comes from conftest.py."""
