"""The heap store's options and the readers of validated options that both the factory and the
engines need (:func:`backend_options_of`, :func:`max_lateness_of`). A leaf module: it imports
nothing from the rest of the heap package, so ``factory``, ``base`` and ``reorder`` all import it
without a cycle."""

from __future__ import annotations

from typing import Any, Mapping

from localstate.core.options import Option, Removed, parse_duration, validate_options
from localstate.core.time import TIMESTAMP_UNITS
from localstate.engines.backends.options import BACKEND_OPTIONS, check_backend_options

__all__ = ["HEAP_KINDS", "HEAP_OPTIONS", "backend_options_of", "max_lateness_of"]

HEAP_KINDS = ("topn", "reorder")
"""Values of a heap store's ``kind``: the option that picks the variant, named as for sketch stores."""


def _lateness(value: Any) -> Any:
    if isinstance(value, str):
        parse_duration(value)  # raises ValueError with a readable reason
        return value
    if value < 0 or value != value:
        raise ValueError(f"must be a non-negative number, got {value!r}")
    return float(value)


def _instead_of_mode(value: Any) -> str:
    kind = value if value in HEAP_KINDS else "topn"  # or "reorder"
    return f'write kind = "{kind}" instead (the same option name as for sketch stores)'


HEAP_OPTIONS: dict[str, Option | Removed] = {
    "kind": Option(str, None, "which heap: topn (ranked items, the default) or reorder (bounded sort "
                              "by timestamp)", choices=HEAP_KINDS),
    "order": Option(str, "max", "topn: which end is the top", choices=("max", "min")),
    "capacity": Option(int, None, "topn: keep at most this many items, evicting the worst", minimum=1,
                       synonyms=("size", "max_size", "limit", "max_items", "n", "top", "maxsize")),
    "max_lateness": Option((int, float, str), None,
                           "reorder: watermark follows max timestamp seen minus this (a number in "
                           "timestamp units, or a duration such as '5s')", parse=_lateness),
    "timestamp_unit": Option(str, "s", "reorder: unit of timestamps, to convert duration strings",
                             choices=tuple(TIMESTAMP_UNITS)),
    "late_policy": Option(str, "error", "reorder: what to do with events older than the watermark",
                          choices=("error", "drop", "side_output")),
    **BACKEND_OPTIONS,
    "mode": Removed(_instead_of_mode),
    "kv": Removed("write the backend options of the nested kv table at the store's top level instead "
                  "(backend, block_cache_size, rocksdb = {...}, map_size, ..., as for every engine kind); "
                  "cache_size and write_batch_size never applied to a heap: drop them"),
}
"""Every option of a heap store: its own, the backend options shared by every engine kind, and the
options of earlier versions with what to write instead."""


def max_lateness_of(options: Mapping[str, Any]) -> float | None:
    """``max_lateness`` in timestamp units: a number as is, a duration string converted to seconds
    and scaled by ``timestamp_unit``."""
    value = options.get("max_lateness")
    if value is None:
        return None
    if isinstance(value, str):
        return parse_duration(value) * TIMESTAMP_UNITS[options.get("timestamp_unit", "s")]
    return float(value)


def backend_options_of(store: str, options: Mapping[str, Any]) -> dict[str, Any]:
    """Validated backend options of a heap store: the store's top-level backend keys (``backend``,
    ``block_cache_size``, ``rocksdb = {...}``, ``map_size``, ...), as for every engine kind."""
    raw = {name: options[name] for name in BACKEND_OPTIONS if options.get(name) is not None}
    validated = validate_options(BACKEND_OPTIONS, raw, f"stores.{store}")
    check_backend_options(store, validated)
    return validated
