"""The key-value engine (``engine = "kv"``): a typed key-value store over RocksDB, LMDB or memory,
with a bounded object cache, write batching and per-key coalescing of changelog records.

``KeyValueEngineFactory().create(context)`` opens one store partition as a :class:`KeyValueEngine`.
See docs/kv.md.
"""

from __future__ import annotations

from typing import Any, Callable, ClassVar, Iterable, Iterator, Mapping

from localstate.core.engine import Redistribution, StorageEngineFactory, StoreContext
from localstate.core.time import TimeSource
from localstate.core.options import Option
from localstate.engines.kv.engine import KeyValueEngine, KVIterator
from localstate.engines.kv.options import KV_OPTIONS, ROCKSDB_PASSTHROUGH, check_kv_options
from localstate.engines.kv.ttl import TtlKeyValueEngine, live_entries, split_stored, unpack_expiry

__all__ = ["KeyValueEngineFactory", "KeyValueEngine", "TtlKeyValueEngine", "KVIterator", "KV_OPTIONS",
           "ROCKSDB_PASSTHROUGH"]


class KeyValueEngineFactory(StorageEngineFactory):
    """Factory of :class:`KeyValueEngine` (entry point ``kv`` in ``localstate.engines``)."""

    options: ClassVar[Mapping[str, Option]] = KV_OPTIONS
    description: ClassVar[str] = ("key-value store over rocksdb, lmdb or memory, with a bounded object cache, "
                                  "write batching and coalesced changelog records")

    def check_options(self, store: str, options: dict[str, Any]) -> None:
        check_kv_options(store, options)

    def create(self, context: StoreContext) -> KeyValueEngine:
        """A :class:`TtlKeyValueEngine` when the store sets ``ttl`` (docs/time/ttl.md), else the plain
        engine: a store without ttl keeps its code path and stored format."""
        if context.options.get("ttl") is not None:
            return TtlKeyValueEngine(context)
        return KeyValueEngine(context)

    def live_entries(self, store: str, options: Mapping[str, Any], time: TimeSource
                     ) -> Callable[[Iterable[tuple[bytes, bytes]]], Iterator[tuple[bytes, bytes]]] | None:
        """A ttl store's live entries without their expiry (``core.engine.LiveEntries``)."""
        return live_entries(options, time)

    def stored_value(self, options: Mapping[str, Any], data: bytes) -> tuple[bytes, float | None]:
        """A ttl store's stored value without its expiry, and the expiry; any other store's as is."""
        return split_stored(data) if options.get("ttl") is not None else (data, None)

    def redistribution(self, store: str, options: Mapping[str, Any],
                       merge_values: Callable[[list[bytes]], bytes] | None) -> Redistribution:
        """Each record goes with its key (``core.engine.Rescalable``). Values of one key from several
        partitions merge only with the user's ``merge_values``; a ttl store's merged value keeps the
        latest expiry of those merged."""
        if merge_values is None:
            return Redistribution(_same_key)
        if options.get("ttl") is None:
            return Redistribution(_same_key, merge_values)

        def merge_stamped(values: list[bytes]) -> bytes:
            widths = [unpack_expiry(value) for value in values]
            latest = max(range(len(values)), key=lambda i: widths[i][0])
            prefix = values[latest][:widths[latest][1]]
            return prefix + merge_values([value[width:] for value, (_, width) in zip(values, widths)])
        return Redistribution(_same_key, merge_stamped)


def _same_key(key: bytes) -> bytes:
    """A kv record belongs to its own key."""
    return key
