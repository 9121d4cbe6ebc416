"""The heap engine's typed columns for the state reader (docs/state-reader.md): a top-N store's
entries as ``item, score, payload``, a reorder buffer's events as ``timestamp, seq, event``, decoded
from the changelog records the engine logs (:mod:`localstate.engines.heap.codec`)."""

from __future__ import annotations

from typing import Any, Iterator, Mapping

from localstate.core.engine import SerdeColumn, StateColumns
from localstate.engines.heap.codec import EVENT_KEY_LEN, decode_score_value, decode_ts

__all__ = ["heap_columns"]

_INT_TS = 0  # the reorder record's kind byte of an event pushed with an int timestamp


def heap_columns(options: Mapping[str, Any], key: SerdeColumn, value: SerdeColumn) -> StateColumns:
    """Top-N (``kind = "topn"``): ``item`` (the key serde), ``score`` (double), ``payload`` (the value
    serde; null when the entry has none). Reorder buffer: ``timestamp`` (double; an int timestamp
    exactly), ``seq`` (arrival order among equal timestamps), ``event`` (the value serde); the
    buffer's meta record (sequence counter, watermark) is not a row."""
    if options.get("kind") == "reorder":
        def events(entries: list[tuple[bytes, bytes]]) -> Iterator[tuple]:
            for data, event in entries:
                if len(data) != EVENT_KEY_LEN:
                    continue  # the meta record
                stamp = decode_ts(data)
                yield (float(int(stamp)) if event[0] == _INT_TS else stamp, int.from_bytes(data[8:], "big"),
                       value.decode(bytes(event[1:])))

        return StateColumns(f"timestamp double, seq bigint, event {value.type}", events)

    def entries_of(entries: list[tuple[bytes, bytes]]) -> Iterator[tuple]:
        for item, data in entries:
            score, payload = decode_score_value(data)
            yield key.decode(item), score, None if payload is None else value.decode(payload)

    return StateColumns(f"item {key.type}, score double, payload {value.type}", entries_of)
