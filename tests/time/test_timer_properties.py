"""Property test of timers against a plain-Python model: random registrations and deletions in both
domains (past ones included) and in three namespaces (the task's own, a json one and a string one),
with event time and processing time moved in between; every timer fires once, through its
namespace's callback, at the first boundary where its domain's time reaches it, event time first,
each domain in one (timestamp, namespace, encoded key) order across namespaces, and deleted ones
never. Small scan chunks mix namespaces within a chunk."""

from __future__ import annotations

import json
from unittest.mock import patch

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from localstate.core.stream import InputRecord
from localstate.core.task import StreamTask
from localstate.runtime.partition import timers as timer_module
from localstate.testing.driver import TaskTestDriver

NAMESPACES = {"": "json", "n1": None, "n2": "string"}
"""namespace -> its key serde ("" is the task's own: the job's timer_key_serde, json)"""


class Ops(StreamTask):
    """Each record's value is ``[op, domain, timestamp, namespace]`` for the record's key."""

    def init(self, context):
        self.timers = context.timers
        self.spaces = {"": context.timers}
        for name in ("n1", "n2"):
            self.spaces[name] = context.timers.namespace(name, self.fired_in(name), key_serde=NAMESPACES[name])

    def process(self, envelope, collector, coordinator):
        op, domain, ts, name = envelope.value
        getattr(self.spaces[name], f"{op}_{domain}_time")(envelope.key, ts)

    def fired_in(self, name):
        def on_fire(key, timestamp, collector, coordinator):
            collector.send("fired", key, [name, self.timers.firing_domain, timestamp])
        return on_fire

    def on_timer(self, key, timestamp, collector, coordinator):
        collector.send("fired", key, ["", self.timers.firing_domain, timestamp])


keys = st.sampled_from(["a", "b", "zz", 3, 12])
stamps = st.integers(0, 40).map(lambda t: t / 2)
ops = st.one_of(
    st.tuples(st.sampled_from(["register", "delete"]), st.sampled_from(["event", "processing"]), keys, stamps,
              st.sampled_from(sorted(NAMESPACES))),
    st.tuples(st.just("event_time"), stamps),
    st.tuples(st.just("wait"), st.integers(0, 6).map(lambda t: t / 2)),
    st.tuples(st.just("commit")),
)


def key_of(key, name: str):
    """The key as the task registers it in namespace ``name`` (the string namespace takes strings)."""
    return str(key) if NAMESPACES[name] == "string" else key


def encoded(key, name: str) -> bytes:
    """The namespace's part of a timer's order: its length, its name, then the key's encoding."""
    text = key if NAMESPACES[name] == "string" else json.dumps(key)
    return bytes([len(name)]) + name.encode() + text.encode()


def model(steps: list[tuple]) -> list[tuple]:
    pending = {"event": set(), "processing": set()}
    watermark, clock = None, 0.0
    fired = []

    def fire() -> None:
        for domain, now in (("event", watermark), ("processing", clock)):
            due = sorted((ts, encoded(key, name), key, name) for ts, key, name in pending[domain]
                         if now is not None and ts <= now)
            for ts, _, key, name in due:
                pending[domain].discard((ts, key, name))
                fired.append((key, [name, domain, ts]))

    for step in steps:
        if step[0] in ("register", "delete"):
            op, domain, key, ts, name = step
            (pending[domain].add if op == "register" else pending[domain].discard)((ts, key_of(key, name), name))
        elif step[0] == "event_time":
            watermark = step[1] if watermark is None else max(watermark, step[1])
        elif step[0] == "wait":
            clock += step[1]
        fire()
    return fired


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(ops, max_size=40), st.sampled_from([2, 3, timer_module.SCAN_CHUNK]))
def test_timers_fire_as_the_model_says(steps: list[tuple], chunk: int) -> None:
    with patch.object(timer_module, "SCAN_CHUNK", chunk), \
            TaskTestDriver(Ops, time={"timers": True}, changelog="memory") as driver:
        for step in steps:
            if step[0] in ("register", "delete"):
                op, domain, key, ts, name = step
                driver.feed("ops", [InputRecord(0, key_of(key, name), [op, domain, ts, name], None)])  # no event time
            elif step[0] == "event_time":
                driver.advance_event_time(step[1])
            elif step[0] == "wait":
                driver.advance(step[1])
            else:
                driver.commit()
        assert driver.outputs("fired", pending=True) == model(steps)
