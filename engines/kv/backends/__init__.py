"""Backends of the key-value engine (``rocksdb``, ``lmdb``, ``memory``) behind one
:class:`~localstate.engines.kv.backends.base.KVBackend` contract. Imported lazily so a job that only
uses ``memory`` never loads rocksdict or lmdb."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from localstate.engines.kv.backends.base import BackendIterator, Item, KVBackend

__all__ = ["KVBackend", "BackendIterator", "Item", "open_backend"]


def open_backend(kind: str, directory: Path, options: Mapping[str, Any], *, store: str = "",
                 partition: int | None = None) -> KVBackend:
    """Open backend ``kind`` under ``directory/<kind>`` (each backend owns its own subdirectory, so
    switching backends never reads another format: the new one starts empty and is restored)."""
    if kind == "memory":
        from localstate.engines.kv.backends.memory import MemoryBackend
        return MemoryBackend()
    if kind == "rocksdb":
        from localstate.engines.kv.backends.rocksdb import RocksDBBackend
        return RocksDBBackend(Path(directory) / "rocksdb", options, store=store, partition=partition)
    if kind == "lmdb":
        from localstate.engines.kv.backends.lmdb import LMDBBackend
        return LMDBBackend(Path(directory) / "lmdb", options, store=store, partition=partition)
    from localstate.errors import ConfigError
    raise ConfigError.at(f"stores.{store}.backend", f"unknown backend {kind!r}; use rocksdb, lmdb or memory")
