"""Saved-search alerts: search over a stream of listings.

Listings are indexed in a full-text search store (``engine = "search"``, tantivy): a new listing
or a price drop adds (or replaces) the document, with ``window`` = the start of its event-time
minute; a sale deletes it. Saved searches are kept in a key-value store. When the partition's event
time enters a new minute, every saved search is run once against the closed minute's changes
(``(<query>) AND window:<start>``) and its matches, if any, are emitted as one alert. A search
saved during a minute already takes part in that minute's alerts; a listing sold before its minute
closes never alerts.

The listings are keyed (and so partitioned) by id and every partition gets every saved search:
each partition's index is one shard, and the alerts of all shards together are the full answer
(see :func:`merge_partitions`).
"""

from __future__ import annotations

from typing import Any, Iterable

from localstate.core.task import Collector, Coordinator, Envelope, StreamTask, TaskContext

__all__ = ["SavedSearchAlerts", "merge_partitions", "WINDOW"]

WINDOW = 60  # seconds of event time


class SavedSearchAlerts(StreamTask):
    def init(self, context: TaskContext) -> None:
        self.listings = context.store("listings")   # search: listing id -> {title, category, price, window}
        self.searches = context.store("searches")   # kv: search id -> {"user", "query"}
        self.clock = context.store("clock")         # kv: "window" -> start of the open window

    def process(self, envelope: Envelope, collector: Collector, coordinator: Coordinator) -> None:
        window = int(envelope.timestamp // WINDOW) * WINDOW
        open_window = self.clock.get("window")
        if open_window is not None and window < open_window:
            return  # late: its window's alerts were already sent
        if open_window is not None and window > open_window:
            self.close_window(open_window, collector)
        if window != open_window:
            self.clock.put("window", window)
        value = envelope.value
        if envelope.stream == "saved_searches":
            self.searches.put(envelope.key, {"user": value["user"], "query": value["query"]})
        elif value.get("sold"):
            self.listings.delete(envelope.key)
        else:
            self.listings.add(envelope.key, {"title": value["title"], "category": value["category"],
                                             "price": value["price"], "window": window})

    def close_window(self, window: int, collector: Collector) -> None:
        """Run every saved search against the listings added or changed in ``window`` (and not sold)."""
        # search() sees the index as of the last flush, and on Spark the runtime flushes only at the
        # end of a micro-batch: flush here, so alerts depend on event time, not on batch boundaries.
        # Safe mid-batch: the flush logs to the changelog first, and a batch that fails after it is
        # rolled back by the runtime's trim of uncommitted changelog records.
        self.listings.flush()
        with self.searches.all() as saved:
            for search_id, search in saved:
                query = f"({search['query']}) AND window:{window}"
                # count() first: search() needs a limit, and every match belongs in the alert.
                matches = self.listings.count(query)
                if matches:
                    hits = self.listings.search(query, limit=matches)
                    listings = [[hit.doc_id, hit.fields["title"], hit.fields["price"]] for hit in hits]
                    collector.send("alerts", search_id, {"window": window, "user": search["user"],
                                                         "query": search["query"], "listings": listings})


def merge_partitions(rows: Iterable[tuple[str, dict[str, Any]]]) -> dict[tuple[str, int], list[str]]:
    """The full alerts from the shards' ``(search id, alert)`` rows: ``(search id, window) -> listing
    ids``, sorted (BM25 statistics are per shard, so the shards' rankings cannot be interleaved)."""
    merged: dict[tuple[str, int], set[str]] = {}
    for search_id, alert in rows:
        merged.setdefault((search_id, alert["window"]), set()).update(lid for lid, _, _ in alert["listings"])
    return {key: sorted(ids) for key, ids in sorted(merged.items())}
