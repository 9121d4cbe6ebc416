"""The task API reference's example (docs/task-api.md): running word counts per user."""

from __future__ import annotations

from localstate.core.task import Collector, Coordinator, Envelope, StreamTask, TaskContext


class WordCounts(StreamTask):
    """Counts each user's words in store ``counts`` ("<user>|<word>" -> count) and emits every new
    running count to output ``word-counts``."""

    def init(self, context: TaskContext) -> None:
        self.counts = context.store("counts")        # the KeyValueEngine itself (docs/kv.md)

    def process(self, envelope: Envelope, collector: Collector, coordinator: Coordinator) -> None:
        for word in envelope.value["text"].lower().split():
            key = f"{envelope.key}|{word}"
            count = (self.counts.get(key) or 0) + 1
            self.counts.put(key, count)
            collector.send("word-counts", key, count)

    def window(self, collector: Collector, coordinator: Coordinator) -> None:
        collector.send("sizes", "keys", sum(1 for _ in self.counts.all()))   # distinct (user, word)
