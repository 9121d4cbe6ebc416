# my_tasks.py, next to job.toml
from localstate import StreamTask


class PageViewCounter(StreamTask):
    def init(self, context):
        self.counts = context.store("counts")          # a KeyValueEngine

    def process(self, envelope, collector, coordinator):
        user = envelope.key
        self.counts.put(user, (self.counts.get(user) or 0) + 1)

    def window(self, collector, coordinator):          # every window_interval
        for user, count in self.counts.all():
            collector.send("counts", user, count)
