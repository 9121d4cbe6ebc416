"""The clicks job of docs/state-as-data.md: clicks per user, and a running total per partition."""

from localstate import StreamTask


class Clicks(StreamTask):
    def init(self, context):
        self.counts = context.store("counts")
        self.total = context.store("total")

    def process(self, envelope, collector, coordinator):
        self.counts.put(envelope.key, (self.counts.get(envelope.key) or 0) + 1)
        self.total.put("total", (self.total.get("total") or 0) + 1)


def add(values):
    """How a rescale merges the totals of several partitions (`rescale_merge`)."""
    return sum(values)
