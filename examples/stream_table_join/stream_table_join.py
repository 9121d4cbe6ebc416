"""Stream-table join: profiles update a local table; each page view is joined with the user's
profile as of the page view's event time (inputs are merged in event-time order)."""

from __future__ import annotations

from localstate.core.task import Collector, Coordinator, Envelope, StreamTask, TaskContext


class EnrichWithZip(StreamTask):
    def init(self, context: TaskContext) -> None:
        self.profiles = context.store("profiles")

    def process(self, envelope: Envelope, collector: Collector, coordinator: Coordinator) -> None:
        if envelope.stream == "profiles":
            self.profiles.put(envelope.key, envelope.value)
            return
        profile = self.profiles.get(envelope.key)
        collector.send("enriched-views", envelope.key, {"page": envelope.value["page"], "ts": envelope.timestamp,
                                                        "zip": profile["zip"] if profile else None})
