"""Every check of the engine contract suite (localstate.core.contract) for every built-in engine
configuration (contract_adapters.py); the crash check runs them all in one child process."""

from __future__ import annotations

from pathlib import Path

import pytest
from contract_adapters import CRASH_ADAPTERS

from localstate.core.contract import ContractSuite, check_crash


class TestBuiltinEngines(ContractSuite):
    """kv x {rocksdb, lmdb, memory, rocksdb spilling}, heap topn/reorder x backends, sketch kinds,
    search; the ``adapter`` fixture comes from conftest.py."""

    test_crash = None  # one child for all adapters below: a child start costs seconds


@pytest.mark.slow
def test_crash_every_builtin_engine(tmp_path: Path) -> None:
    check_crash(CRASH_ADAPTERS, tmp_path, seed=1, kills=5)
