"""Every check of the engine contract suite (localstate.testing.contract) for every built-in engine
configuration (contract_adapters.py); the crash check runs them all in one child process."""

from __future__ import annotations

from pathlib import Path

from contract_adapters import CRASH_ADAPTERS

from localstate.testing.contract import ContractSuite, check_crash


class TestBuiltinEngines(ContractSuite):
    """kv x {rocksdb, lmdb, memory, rocksdb spilling}, heap topn/reorder x backends, sketch kinds,
    search; the ``adapter`` fixture comes from conftest.py."""

    test_crash = None  # one child for all adapters below: a child start costs seconds


def _adapter(name: str) -> int:
    """The index of the crash adapter called ``name`` (ValueError if it is gone: the kill points
    below name the stores they were chosen for)."""
    return [adapter.name for adapter in CRASH_ADAPTERS].index(name)


#: One SIGKILL per kill point class of the crash child (``(marker, store index in CRASH_ADAPTERS, nth
#: line, delay)``): inside a flush (a persistent kv, its second flush, a moment in), between a flush
#: and its checkpoint (the bulk-loaded LMDB kv, the one with the longest uncommitted tail), and
#: inside the recovery of the next child. Chosen, not drawn: every class is hit in every run.
KILL_POINTS = [("flushing", _adapter("KvAdapter(backend=rocksdb)"), 2, 0.0002),
               ("checkpointing", _adapter("KvAdapter(backend=lmdb,bulk=3000)"), 1, 0.0),
               ("recovering", _adapter("TopNAdapter(backend=memory,capacity=8,order=max,restore_batch_size=None)"),
                1, 0.0145)]


def test_crash_every_builtin_engine(tmp_path: Path) -> None:
    check_crash(CRASH_ADAPTERS, tmp_path, seed=1, kill_points=KILL_POINTS)
