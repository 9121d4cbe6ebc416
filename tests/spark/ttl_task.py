"""The task of the Spark ttl test (imported by the Python workers)."""

from __future__ import annotations

from localstate.core.task import Collector, Coordinator, Envelope, StreamTask


class SeenBefore(StreamTask):
    """Emits ``(key, seen)``: whether the key's entry in the ttl store ``counts`` was live, then
    writes it again."""

    def init(self, context):
        self.counts = context.kv("counts")

    def process(self, envelope: Envelope, collector: Collector, coordinator: Coordinator) -> None:
        collector.send("seen", envelope.key, self.counts.get(envelope.key) is not None)
        self.counts.put(envelope.key, 1)
