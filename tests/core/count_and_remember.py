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


_STORES = """[stores.counts]
engine = "kv"
backend = "rocksdb"
key_serde = "string"
value_serde = "int"

[stores.last]
engine = "kv"
backend = "lmdb"
key_serde = "string"
value_serde = "json"

[stores.cache]
engine = "kv"
backend = "memory"
key_serde = "string"
value_serde = "int"

[stores.top]
engine = "heap"
key_serde = "string"
"""

_SCRATCH = """
[stores.scratch]
engine = "kv"
backend = "lmdb"
key_serde = "string"
value_serde = "int"
changelog = false
"""


def stores_toml(*, top_order: bool = True, scratch: bool = True) -> str:
    """The ``[stores.*]`` tables of a CountAndRemember job: top max-ordered, and an unlogged lmdb scratch store."""
    return _STORES + ('order = "max"\n' if top_order else "") + (_SCRATCH if scratch else "")
