"""State TTL through the runtime: the TaskTestDriver hands each store its partition's time
(`StoreContext.time`), so moving processing time or the watermark expires entries as a job would;
expired entries are invisible to the task, purged with tombstones, and gone after a crash and
restart (docs/time/ttl.md)."""

from __future__ import annotations

from localstate.core.task import StreamTask
from localstate.testing.driver import TaskTestDriver


class SeenBefore(StreamTask):
    """Emits whether the key was seen within the ttl, then remembers it."""

    def init(self, context):
        self.seen = context.kv("seen")

    def process(self, envelope, collector, coordinator):
        collector.send("out", envelope.key, self.seen.get(envelope.key) is not None)
        self.seen.put(envelope.key, envelope.value)


def _stores(**ttl) -> dict:
    return {"seen": {"engine": "kv", "key_serde": "string", "value_serde": "json", "ttl": "10s", **ttl}}


def test_processing_time_ttl_through_the_driver() -> None:
    with TaskTestDriver(SeenBefore, stores=_stores(), commit_every=1) as d:
        d.send("in", "a", 1)          # driver time 0: a expires at 10
        d.advance_processing_time(5)
        d.send("in", "b", 1)          # b expires at 15
        d.send("in", "a", 2)          # seen; a now expires at 15
        d.advance_processing_time(12)  # 17: both expired
        d.send("in", "a", 3)
        d.send("in", "b", 3)
        d.commit()
        assert d.outputs("out") == [("a", False), ("b", False), ("a", True), ("a", False), ("b", False)]
        d.crash()
        d.restart()
        d.advance_processing_time(5)   # 22: the entries written at 17 are live after the restart
        d.send("in", "a", 4)
        d.commit()
        assert d.outputs("out")[-1] == ("a", True)


def test_event_time_ttl_through_the_driver() -> None:
    with TaskTestDriver(SeenBefore, stores=_stores(ttl_time="event"), commit_every=1) as d:
        d.send("in", "a", 1, timestamp=100.0)
        d.send("in", "a", 2, timestamp=105.0)   # seen
        d.send("in", "x", 0, timestamp=200.0)   # the watermark moves to 200: a expired
        d.send("in", "a", 3, timestamp=201.0)
        d.commit()
        assert [seen for key, seen in d.outputs("out") if key == "a"] == [False, True, False]
