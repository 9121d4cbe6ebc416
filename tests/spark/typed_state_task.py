"""The task of the state reader's typed-columns test (tests/spark/test_state_reader_columns.py):
every engine kind that offers typed columns, fed from one record stream (importable by Spark's
Python workers when copied next to the job file)."""

from __future__ import annotations

import datetime as dt
from typing import Any

from localstate.core.task import Collector, Coordinator, Envelope, StreamTask, TaskContext


def document(user: str, i: int) -> dict[str, Any]:
    """The search document of ``user`` after record ``i``: every field type, a multi-valued one."""
    return {"title": f"page {i % 4} of {user}", "views": i, "ratio": i / 7,
            "at": dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc) + dt.timedelta(hours=i),
            "tags": ["odd", "seen"] if i % 2 else "even"}


class TypedState(StreamTask):
    """top (heap topn): users by their last record number, payload {"i"}; buffer (heap reorder):
    every record at timestamp i (ints) or i + 0.5 (floats), drained up to i - 6 every 5th record;
    visitors (hll), seen (bloom), latency (quantiles); docs (search): one document per user, deleted
    on every 9th record."""

    def init(self, context: TaskContext) -> None:
        self.top, self.buffer = context.store("top"), context.store("buffer")
        self.visitors, self.seen, self.latency = context.store("visitors"), context.store("seen"), context.store("latency")
        self.docs = context.store("docs")

    def process(self, envelope: Envelope, collector: Collector, coordinator: Coordinator) -> None:
        user, i = envelope.key, int(envelope.value["i"])
        self.top.push(user, (i * 37) % 101, {"i": i} if i % 3 else None)
        self.buffer.push({"user": user, "i": i}, i if i % 2 else i + 0.5)
        if i % 5 == 4:
            self.buffer.drain_until(i - 6)
        self.visitors.add(f"day-{i % 3}", user)
        self.seen.add("users", user)
        self.latency.add(f"page-{i % 2}", float((i * 7) % 101))
        if i % 9 == 8:
            self.docs.delete(user)
        else:
            self.docs.add(user, document(user, i))
