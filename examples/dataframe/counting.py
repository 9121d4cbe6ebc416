"""The example's task: a running count per user, kept in the kv store ``counts``."""

from localstate import Collector, Coordinator, Envelope, StreamTask, TaskContext


class CountPerUser(StreamTask):
    """Counts rows per user; sends ``[count, rate value]`` to the ``counts`` output for every row."""

    def init(self, context: TaskContext) -> None:
        self.counts = context.store("counts")

    def process(self, envelope: Envelope, collector: Collector, coordinator: Coordinator) -> None:
        count = (self.counts.get(envelope.key) or 0) + 1
        self.counts.put(envelope.key, count)
        collector.send("counts", envelope.key, [count, envelope.value["value"]])
