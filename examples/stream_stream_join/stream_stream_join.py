"""Stream-stream join with expiry on timers: an impression waits in a store, with an event-time
timer at the end of its attribution window; a click within WINDOW seconds of its impression is
attributed (once) and deletes the timer; a timer that fires finds an impression nobody clicked in
time, which it expires (emitted, then dropped from the store)."""

from __future__ import annotations

import math
from typing import Any

from localstate.core.task import Collector, Coordinator, Envelope, StreamTask, TaskContext

WINDOW = 30.0


def expiry(impression_ts: float) -> float:
    """When an impression expires: once event time is past its window (a click exactly WINDOW
    seconds later still counts, so the timer is the next representable time after the window)."""
    return math.nextafter(impression_ts + WINDOW, math.inf)


class ClickAttribution(StreamTask):
    def init(self, context: TaskContext) -> None:
        self.impressions = context.kv("impressions")
        self.timers = context.timers

    def process(self, envelope: Envelope, collector: Collector, coordinator: Coordinator) -> None:
        ts = envelope.timestamp
        if envelope.stream == "impressions":
            self.impressions.put(envelope.key, envelope.value)
            self.timers.register_event_time(envelope.key, expiry(ts))
            return
        impression = self.impressions.get(envelope.key)
        if impression is not None and ts - impression["ts"] <= WINDOW:
            collector.send("attributed", envelope.key, {"ad": impression["ad"], "delay": ts - impression["ts"]})
            self.impressions.delete(envelope.key)
            self.timers.delete_event_time(envelope.key, expiry(impression["ts"]))
        else:
            collector.send("unmatched", envelope.key, {"ts": ts})

    def on_timer(self, key: Any, timestamp: float, collector: Collector, coordinator: Coordinator) -> None:
        impression = self.impressions.get(key)
        if impression is not None:
            collector.send("expired", key, {"ad": impression["ad"]})
            self.impressions.delete(key)
