"""Test task shared by the inspect and state-reader tests (importable by Spark's Python workers when
copied next to a job file)."""

from __future__ import annotations

from localstate.core.task import StreamTask


class CountAndRemember(StreamTask):
    """counts: user -> views (rocksdb); last: user -> {"page"} (lmdb); cache: user -> views (memory);
    top: users by views (heap). A "forget" value deletes the user from counts and last."""

    def init(self, context):
        self.counts, self.last = context.store("counts"), context.store("last")
        self.cache, self.top = context.store("cache"), context.store("top")

    def process(self, envelope, collector, coordinator):
        user, value = envelope.key, envelope.value
        if value == "forget":
            self.counts.delete(user)
            self.last.delete(user)
            return
        count = (self.counts.get(user) or 0) + 1
        self.counts.put(user, count)
        self.cache.put(user, count)
        self.last.put(user, {"page": value})
        self.top.push(user, count)
