"""``engine = "heap"``: the factory that validates heap options and opens a top-N store or a
reorder buffer depending on ``kind``."""

from __future__ import annotations

from typing import Any, ClassVar, Mapping

from localstate.core.engine import (COPY, Redistribution, SerdeColumn, SerdeUse, StateColumns, StorageEngine,
                                    StorageEngineFactory, StoreContext, StoreSerdes)
from localstate.core.options import Option, Removed
from localstate.engines.heap.options import (HEAP_KINDS, HEAP_OPTIONS, backend_options_of,
                                             max_lateness_of)
from localstate.errors import ConfigError, ConfigProblem
from localstate.engines.heap.codec import META_KEY, SCORE_HEADER, decode_meta, encode_meta
from localstate.engines.heap.columns import heap_columns
from localstate.engines.heap.reorder import ReorderBufferEngine
from localstate.engines.heap.topn import TopNEngine

__all__ = ["HEAP_KINDS", "HeapEngineFactory", "backend_options_of", "kind_of", "max_lateness_of"]


def kind_of(store: str, options: Mapping[str, Any]) -> str:
    """The heap variant a store asks for: ``kind``, else ``"topn"``."""
    return options.get("kind") or "topn"


class HeapEngineFactory(StorageEngineFactory):
    """Opens :class:`~localstate.engines.heap.TopNEngine` (``kind = "topn"``) or
    :class:`~localstate.engines.heap.ReorderBufferEngine` (``kind = "reorder"``). Validated options
    carry the resolved ``kind``."""

    description: ClassVar[str] = ("running top-N (ranked items with scores, optional capacity) and bounded "
                                  "sort (reorder buffer released by watermark), persisted on a kv backend")
    options: ClassVar[Mapping[str, Option | Removed]] = HEAP_OPTIONS
    unsupported_options: ClassVar[Mapping[str, str]] = {
        "ttl": "a heap entry leaves by rank, pop or release, not by age (docs/time/ttl.md); expire them "
               "from the task, e.g. with a timer"}

    def check_options(self, store: str, options: dict[str, Any]) -> None:
        options["kind"] = kind_of(store, options)
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
        options.update(backend_options_of(store, options))

    def serdes(self, options: Mapping[str, Any]) -> StoreSerdes:
        """top-N: the task's items (key serde) and payloads (value serde); a reorder buffer: the
        task's events (value serde), keyed by timestamp and arrival order, which it encodes itself."""
        if kind_of("", options) == "reorder":
            return StoreSerdes(key=None, value=SerdeUse("events"))
        return StoreSerdes(key=SerdeUse("items"), value=SerdeUse("payloads"))

    def create(self, context: StoreContext) -> StorageEngine:
        if kind_of(context.store, context.options) == "reorder":
            return ReorderBufferEngine(context)
        return TopNEngine(context)

    def state_columns(self, store: str, options: Mapping[str, Any], key: SerdeColumn,
                      value: SerdeColumn) -> StateColumns:
        """``item, score, payload`` (top-N) or ``timestamp, seq, event`` (reorder buffer):
        :func:`~localstate.engines.heap.columns.heap_columns`."""
        return heap_columns({**options, "kind": kind_of(store, options)}, key, value)

    def redistribution(self, store: str, options: Mapping[str, Any],
                       merge_values: Any = None) -> Redistribution:
        """``core.engine.Rescalable``. Top-N: an item goes with its key; an item found in several
        partitions keeps its best score, and a capped heap keeps its best ``capacity`` items. Reorder
        buffer: its events belong to no key (refused unless released first); its meta record is
        copied, merged conservatively (the lowest drained watermark and largest timestamp seen, the
        largest sequence)."""
        if kind_of(store, options) == "reorder":
            def merge_meta(values: list[bytes]) -> bytes:
                metas = [decode_meta(value) for value in values]
                return encode_meta(max(m[0] for m in metas), min(m[1] for m in metas), min(m[2] for m in metas))
            return Redistribution(lambda key: COPY if key == META_KEY else None, merge_meta)
        best = max if options.get("order", "max") == "max" else min

        def merge_items(values: list[bytes]) -> bytes:
            return best(values, key=lambda value: SCORE_HEADER.unpack_from(value)[0])

        capacity = options.get("capacity")

        def keep_best(records: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
            if capacity is None or len(records) <= capacity:
                return records
            sign = -1.0 if best is max else 1.0
            ranked = sorted(records, key=lambda kv: (sign * SCORE_HEADER.unpack_from(kv[1])[0], kv[0]))
            return sorted(ranked[:capacity])
        return Redistribution(lambda key: key, merge_items, keep_best)
