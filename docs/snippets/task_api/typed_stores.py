"""docs/task-api.md, "Typed access": the init() shown there, in a task tests/docs/test_code_blocks.py runs
with the TaskTestDriver (a kv store and a heap store)."""

from localstate import StreamTask
from localstate.engines.heap import TopNEngine


class TrendingPages(StreamTask):
    # --8<-- [start:init]
    def init(self, context):
        self.counts = context.kv("counts")                  # KeyValueStore
        self.top = context.store("trending", TopNEngine)    # from localstate.engines.heap import TopNEngine
    # --8<-- [end:init]

    def process(self, envelope, collector, coordinator):
        views = (self.counts.get(envelope.key) or 0) + 1
        self.counts.put(envelope.key, views)
        self.top.push(envelope.key, views)
