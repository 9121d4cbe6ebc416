"""Property test of timers against a plain-Python model: random registrations and deletions in both
domains (past ones included), with event time and processing time moved in between; every timer
fires once, at the first boundary where its domain's time reaches it, event time first, each domain
in (timestamp, encoded key) order, and deleted ones never."""

from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from localstate.core.stream import InputRecord
from localstate.core.task import StreamTask
from localstate.testing.driver import TaskTestDriver


class Ops(StreamTask):
    """Each record's value is ``[op, domain, timestamp]`` for the record's key."""

    def init(self, context):
        self.timers = context.timers

    def process(self, envelope, collector, coordinator):
        op, domain, ts = envelope.value
        method = getattr(self.timers, f"{op}_{domain}_time")
        method(envelope.key, ts)

    def on_timer(self, key, timestamp, collector, coordinator):
        collector.send("fired", key, [self.timers.firing_domain, timestamp])


keys = st.sampled_from(["a", "b", "zz", 3, 12])
stamps = st.integers(0, 40).map(lambda t: t / 2)
ops = st.one_of(
    st.tuples(st.sampled_from(["register", "delete"]), st.sampled_from(["event", "processing"]), keys, stamps),
    st.tuples(st.just("event_time"), stamps),
    st.tuples(st.just("wait"), st.integers(0, 6).map(lambda t: t / 2)),
    st.tuples(st.just("commit")),
)


def model(steps: list[tuple]) -> list[tuple]:
    pending = {"event": set(), "processing": set()}
    watermark, clock = None, 0.0
    fired = []

    def fire() -> None:
        for domain, now in (("event", watermark), ("processing", clock)):
            due = sorted((ts, json.dumps(key).encode(), key) for ts, key in pending[domain]
                         if now is not None and ts <= now)
            for ts, _, key in due:
                pending[domain].discard((ts, key))
                fired.append((key, [domain, ts]))

    for step in steps:
        if step[0] in ("register", "delete"):
            op, domain, key, ts = step
            (pending[domain].add if op == "register" else pending[domain].discard)((ts, key))
        elif step[0] == "event_time":
            watermark = step[1] if watermark is None else max(watermark, step[1])
        elif step[0] == "wait":
            clock += step[1]
        fire()
    return fired


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(ops, max_size=40))
def test_timers_fire_as_the_model_says(steps: list[tuple]) -> None:
    with TaskTestDriver(Ops, time={"timers": True}, changelog="memory") as driver:
        for step in steps:
            if step[0] in ("register", "delete"):
                op, domain, key, ts = step
                driver.feed("ops", [InputRecord(0, key, [op, domain, ts], None)])  # no event time
            elif step[0] == "event_time":
                driver.advance_event_time(step[1])
            elif step[0] == "wait":
                driver.advance(step[1])
            else:
                driver.commit()
        assert driver.outputs("fired", pending=True) == model(steps)
