"""The key-value engine (``engine = "kv"``): a typed key-value store over RocksDB, LMDB or memory,
with a bounded object cache, write batching and per-key coalescing of changelog records.

``KeyValueEngineFactory().create(context)`` opens one store partition as a :class:`KeyValueEngine`.
See docs/kv.md.
"""

from __future__ import annotations

from typing import Any, ClassVar, Mapping

from localstate.core.engine import StorageEngineFactory, StoreContext
from localstate.core.options import Option
from localstate.engines.kv.engine import KeyValueEngine, KVIterator
from localstate.engines.kv.options import KV_OPTIONS, ROCKSDB_PASSTHROUGH, check_kv_options

__all__ = ["KeyValueEngineFactory", "KeyValueEngine", "KVIterator", "KV_OPTIONS", "ROCKSDB_PASSTHROUGH"]


class KeyValueEngineFactory(StorageEngineFactory):
    """Factory of :class:`KeyValueEngine` (entry point ``kv`` in ``localstate.engines``)."""

    options: ClassVar[Mapping[str, Option]] = KV_OPTIONS
    description: ClassVar[str] = ("key-value store over rocksdb, lmdb or memory, with a bounded object cache, "
                                  "write batching and coalesced changelog records")

    def check_options(self, store: str, options: dict[str, Any]) -> None:
        check_kv_options(store, options)

    def create(self, context: StoreContext) -> KeyValueEngine:
        return KeyValueEngine(context)
