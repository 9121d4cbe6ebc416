"""Distinct counts: the number of different users who viewed each page in every event-time hour,
and in the whole hour (all pages), kept as HyperLogLog sketches in a sketch store
(``engine = "sketch"``, ``kind = "hll"``) and emitted once the partition's event time has moved
past the hour.

A sketch costs 2**precision bytes however many users it sees, and its changelog records are
changed registers, not views. The hour's all-pages sketch is the union (register-wise max) of its
page sketches, made once at close: a union of HyperLogLogs loses nothing, it is exactly the sketch
of all the hour's users.

The input is keyed (and so partitioned) by user, so the partitions see disjoint sets of users: the
global number of distinct users of a page or hour is the sum of the partitions' counts (see
:func:`merge_partitions`).
"""

from __future__ import annotations

from typing import Any, Iterable

from localstate.core.task import Collector, Coordinator, Envelope, StreamTask, TaskContext

__all__ = ["DistinctVisitors", "merge_partitions", "HOUR", "ALL_PAGES"]

HOUR = 3600
ALL_PAGES = "*"  # the sketch name suffix of an hour's all-pages sketch (no page is called "*")


def sketch_name(hour: int, page: str) -> str:
    # Zero-padded hour first: the names of one hour share a prefix.
    return f"{hour:012d}|{page}"


class DistinctVisitors(StreamTask):
    def init(self, context: TaskContext) -> None:
        self.visitors = context.store("visitors")   # sketch (hll): "<hour>|<page>" -> users
        self.clock = context.store("clock")         # kv: "hour" -> the open hour of this partition

    def process(self, envelope: Envelope, collector: Collector, coordinator: Coordinator) -> None:
        hour = int(envelope.timestamp // HOUR)
        open_hour = self.clock.get("hour")
        if open_hour is not None and hour < open_hour:
            return  # late: its hour was already emitted
        if open_hour is not None and hour > open_hour:
            self.close_hour(open_hour, collector)
        if hour != open_hour:
            self.clock.put("hour", hour)
        self.visitors.add(sketch_name(hour, envelope.value["page"]), envelope.key)

    def close_hour(self, hour: int, collector: Collector) -> None:
        """Emit the hour's per-page and all-pages estimates, then forget its sketches (their
        registers become tombstones at the next commit)."""
        prefix = sketch_name(hour, "")
        # Only the open hour has non-empty sketches: every closed one was deleted when it closed.
        pages = [name for name in self.visitors.names() if name.startswith(prefix)]
        for name in pages:
            collector.send("page-visitors", name[len(prefix):],
                           {"hour": hour, "visitors": round(self.visitors.count(name))})
        everyone = sketch_name(hour, ALL_PAGES)
        self.visitors.merge(everyone, *pages)
        collector.send("hourly-visitors", hour,
                       {"hour": hour, "visitors": round(self.visitors.count(everyone)), "pages": len(pages)})
        for name in [*pages, everyone]:
            self.visitors.delete(name)


def merge_partitions(rows: Iterable[dict[str, Any]]) -> dict[int, int]:
    """Global distinct users per hour from the partitions' ``hourly-visitors`` values: a sum,
    because every user lives in exactly one partition."""
    merged: dict[int, int] = {}
    for row in rows:
        merged[row["hour"]] = merged.get(row["hour"], 0) + row["visitors"]
    return dict(sorted(merged.items()))
