"""``engine = "heap"``: the factory that validates heap options and opens a top-N store or a
reorder buffer depending on ``mode``."""

from __future__ import annotations

from typing import Any, ClassVar, Mapping

from localstate.core.engine import StorageEngine, StorageEngineFactory, StoreContext
from localstate.core.options import Option, parse_duration, validate_options
from localstate.errors import ConfigError, ConfigProblem

__all__ = ["HeapEngineFactory", "inner_kv_options", "max_lateness_of"]

_UNITS = {"s": 1.0, "ms": 1e3, "us": 1e6, "ns": 1e9}


def _lateness(value: Any) -> Any:
    if isinstance(value, str):
        parse_duration(value)  # raises ValueError with a readable reason
        return value
    if value < 0 or value != value:
        raise ValueError(f"must be a non-negative number, got {value!r}")
    return float(value)


def max_lateness_of(options: Mapping[str, Any]) -> float | None:
    """``max_lateness`` in timestamp units: a number as is, a duration string converted to seconds
    and scaled by ``timestamp_unit``."""
    value = options.get("max_lateness")
    if value is None:
        return None
    if isinstance(value, str):
        return parse_duration(value) * _UNITS[options.get("timestamp_unit", "s")]
    return float(value)


def inner_kv_options(store: str, options: Mapping[str, Any]) -> dict[str, Any]:
    """Validated kv-engine options for the heap's backend (``backend`` plus the ``kv`` table), so a
    heap store accepts and checks exactly what a kv store would. The heap uses the backend options
    (RocksDB/LMDB tuning, ``restore_batch_size``); it has no object cache and writes only at flush(),
    so ``cache_size`` and ``write_batch_size`` are accepted but unused (defaults: 0 and unlimited)."""
    from localstate.engines.kv import KeyValueEngineFactory

    kv = KeyValueEngineFactory()
    raw = {"backend": options.get("backend", "rocksdb"), "cache_size": 0, "write_batch_size": 1 << 30,
           **dict(options.get("kv") or {})}
    validated = validate_options(kv.options, raw, f"stores.{store}.kv")
    try:
        from localstate.engines.kv.options import check_kv_options
    except ImportError:  # the kv plugin reorganised its modules: use its public check
        kv.check_options(store, validated)
    else:
        check_kv_options(store, validated, prefix="kv.")
    return validated


class HeapEngineFactory(StorageEngineFactory):
    """Opens :class:`~localstate.engines.heap.TopNEngine` (``mode = "topn"``) or
    :class:`~localstate.engines.heap.ReorderBufferEngine` (``mode = "reorder"``)."""

    description: ClassVar[str] = ("running top-N (ranked items with scores, optional capacity) and bounded "
                                  "sort (reorder buffer released by watermark), persisted on a kv backend")
    options: ClassVar[Mapping[str, Option]] = {
        "mode": Option(str, "topn", "topn: ranked items; reorder: bounded sort by timestamp",
                       choices=("topn", "reorder")),
        "order": Option(str, "max", "topn: which end is the top", choices=("max", "min")),
        "capacity": Option(int, None, "topn: keep at most this many items, evicting the worst", minimum=1),
        "max_lateness": Option((int, float, str), None,
                               "reorder: watermark follows max timestamp seen minus this (a number in "
                               "timestamp units, or a duration such as '5s')", parse=_lateness),
        "timestamp_unit": Option(str, "s", "reorder: unit of timestamps, to convert duration strings",
                                 choices=tuple(_UNITS)),
        "late_policy": Option(str, "error", "reorder: what to do with events older than the watermark",
                              choices=("error", "drop", "side_output")),
        "backend": Option(str, "rocksdb", "local persistence: a kv engine backend (memory persists nothing)",
                          choices=("rocksdb", "lmdb", "memory")),
        "kv": Option(dict, None, "kv-engine options for the backend (block_cache_size, compression, "
                                 "rocksdb = {...}, map_size, restore_batch_size, ...)"),
    }

    def check_options(self, store: str, options: dict[str, Any]) -> None:
        problems = []
        if options["mode"] == "reorder":
            if options["capacity"] is not None:
                problems.append(ConfigProblem(f"stores.{store}.capacity",
                                              "only applies to mode = \"topn\"; a reorder buffer must not "
                                              "lose events"))
        elif options["max_lateness"] is not None:
            problems.append(ConfigProblem(f"stores.{store}.max_lateness", "only applies to mode = \"reorder\""))
        if problems:
            raise ConfigError(problems)
        inner_kv_options(store, options)

    def create(self, context: StoreContext) -> StorageEngine:
        if context.options.get("mode", "topn") == "reorder":
            from localstate.engines.heap.reorder import ReorderBufferEngine
            return ReorderBufferEngine(context)
        from localstate.engines.heap.topn import TopNEngine
        return TopNEngine(context)
