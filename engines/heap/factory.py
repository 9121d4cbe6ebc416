"""``engine = "heap"``: the factory that validates heap options and opens a top-N store or a
reorder buffer depending on ``mode``."""

from __future__ import annotations

import warnings
from typing import Any, ClassVar, Mapping

from localstate.core.engine import StorageEngine, StorageEngineFactory, StoreContext
from localstate.core.options import Option, parse_duration, validate_options
from localstate.engines.backends.options import BACKEND_OPTIONS, check_backend_options
from localstate.errors import ConfigError, ConfigProblem

__all__ = ["HeapEngineFactory", "backend_options_of", "inner_kv_options", "max_lateness_of"]

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


#: Keys the deprecated ``kv = {...}`` table accepted for the kv engine that mean nothing to a heap.
_LEGACY_KV_ONLY: dict[str, Option] = {
    "cache_size": Option(int, 0, "unused by the heap (it has no object cache)", minimum=0),
    "write_batch_size": Option(int, 1 << 30, "unused by the heap (it writes only at flush)", minimum=1),
}


def backend_options_of(store: str, options: Mapping[str, Any]) -> dict[str, Any]:
    """Validated backend options of a heap store: the store's top-level backend keys (``backend``,
    ``block_cache_size``, ``rocksdb = {...}``, ``map_size``, ...), as for every engine kind. The
    former nested ``kv = {...}`` table still works (its keys win) but is deprecated."""
    raw = {name: options[name] for name in BACKEND_OPTIONS if options.get(name) is not None}
    nested = dict(options.get("kv") or {})
    if nested:
        legacy = validate_options({**BACKEND_OPTIONS, **_LEGACY_KV_ONLY}, nested, f"stores.{store}.kv")
        raw.update({name: legacy[name] for name in nested if name in BACKEND_OPTIONS})
        check_backend_options(store, {"rocksdb": legacy["rocksdb"]}, prefix="kv.")
    validated = validate_options(BACKEND_OPTIONS, raw, f"stores.{store}")
    check_backend_options(store, validated)
    return validated


inner_kv_options = backend_options_of
"""Former name of :func:`backend_options_of`."""


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
        **BACKEND_OPTIONS,
        "kv": Option(dict, None, "deprecated: backend options nested in a table; write them at the store's "
                                 "top level instead (block_cache_size, rocksdb = {...}, map_size, ...)"),
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
        if options.get("kv"):
            warnings.warn(f"stores.{store}.kv: the nested kv table is deprecated; write its keys at the "
                          "store's top level (as for every engine kind)", DeprecationWarning, stacklevel=2)
        options.update(backend_options_of(store, options))

    def create(self, context: StoreContext) -> StorageEngine:
        if context.options.get("mode", "topn") == "reorder":
            from localstate.engines.heap.reorder import ReorderBufferEngine
            return ReorderBufferEngine(context)
        from localstate.engines.heap.topn import TopNEngine
        return TopNEngine(context)
