"""``engine = "heap"``: the factory that validates heap options and opens a top-N store or a
reorder buffer depending on ``kind`` (formerly ``mode``, still accepted with a deprecation warning)."""

from __future__ import annotations

import warnings
from typing import Any, ClassVar, Mapping

from localstate.core.engine import StorageEngine, StorageEngineFactory, StoreContext
from localstate.core.options import Option, parse_duration, validate_options
from localstate.engines.backends.options import BACKEND_OPTIONS, check_backend_options
from localstate.errors import ConfigError, ConfigProblem

__all__ = ["HEAP_KINDS", "HeapEngineFactory", "backend_options_of", "inner_kv_options", "kind_of",
           "max_lateness_of"]

HEAP_KINDS = ("topn", "reorder")
"""Values of a heap store's ``kind``: the option that picks the variant, named as for sketch stores."""

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


def kind_of(store: str, options: Mapping[str, Any]) -> str:
    """The heap variant a store asks for: ``kind``, else the deprecated ``mode`` (with a
    DeprecationWarning), else ``"topn"``. Both given with different values is a ConfigError at
    ``stores.<store>.kind``: guessing would open the wrong variant and rebuild its local state."""
    kind, legacy = options.get("kind"), options.get("mode")
    if legacy is None:
        return kind or "topn"
    if kind is not None and kind != legacy:
        raise ConfigError([ConfigProblem(f"stores.{store}.kind",
                                         f"kind = {kind!r} conflicts with mode = {legacy!r} (the former name "
                                         "of kind)")],
                          hint="remove mode and keep only kind")
    warnings.warn(f"stores.{store}.mode: mode is deprecated; write kind = {legacy!r} instead (the same "
                  "option name as for sketch stores)", DeprecationWarning, stacklevel=4)
    return legacy


class HeapEngineFactory(StorageEngineFactory):
    """Opens :class:`~localstate.engines.heap.TopNEngine` (``kind = "topn"``) or
    :class:`~localstate.engines.heap.ReorderBufferEngine` (``kind = "reorder"``). Validated options
    carry the resolved ``kind``; the deprecated ``mode`` is dropped from them."""

    description: ClassVar[str] = ("running top-N (ranked items with scores, optional capacity) and bounded "
                                  "sort (reorder buffer released by watermark), persisted on a kv backend")
    options: ClassVar[Mapping[str, Option]] = {
        "kind": Option(str, None, "which heap: topn (ranked items, the default) or reorder (bounded sort "
                                  "by timestamp)", choices=HEAP_KINDS),
        "mode": Option(str, None, "deprecated: former name of kind", choices=HEAP_KINDS),
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
        options["kind"] = kind_of(store, options)
        options.pop("mode", None)
        problems = []
        if options["kind"] == "reorder":
            if options["capacity"] is not None:
                problems.append(ConfigProblem(f"stores.{store}.capacity",
                                              "only applies to kind = \"topn\"; a reorder buffer must not "
                                              "lose events"))
        elif options["max_lateness"] is not None:
            problems.append(ConfigProblem(f"stores.{store}.max_lateness", "only applies to kind = \"reorder\""))
        if problems:
            raise ConfigError(problems)
        if options.get("kv"):
            warnings.warn(f"stores.{store}.kv: the nested kv table is deprecated; write its keys at the "
                          "store's top level (as for every engine kind)", DeprecationWarning, stacklevel=2)
        options.update(backend_options_of(store, options))

    def create(self, context: StoreContext) -> StorageEngine:
        if kind_of(context.store, context.options) == "reorder":
            from localstate.engines.heap.reorder import ReorderBufferEngine
            return ReorderBufferEngine(context)
        from localstate.engines.heap.topn import TopNEngine
        return TopNEngine(context)
