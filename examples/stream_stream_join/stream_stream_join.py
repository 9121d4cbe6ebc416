"""Stream-stream join with expiry: impressions wait in a store (plus a time index); a click within
WINDOW seconds of its impression is attributed (once); older impressions are expired as event time
moves on."""

from __future__ import annotations

from localstate.core.task import Collector, Coordinator, Envelope, StreamTask, TaskContext

WINDOW = 30.0


class ClickAttribution(StreamTask):
    def init(self, context: TaskContext) -> None:
        self.impressions = context.store("impressions")
        self.expiry = context.store("expiry")

    def process(self, envelope: Envelope, collector: Collector, coordinator: Coordinator) -> None:
        ts = envelope.timestamp
        self.expire(ts, collector)
        if envelope.stream == "impressions":
            self.impressions.put(envelope.key, envelope.value)
            self.expiry.put(f"{int(ts * 1000):015d}|{envelope.key}", 0)
            return
        impression = self.impressions.get(envelope.key)
        if impression is not None and ts - impression["ts"] <= WINDOW:
            collector.send("attributed", envelope.key, {"ad": impression["ad"], "delay": ts - impression["ts"]})
            self.impressions.delete(envelope.key)
            self.expiry.delete(f"{int(impression['ts'] * 1000):015d}|{envelope.key}")
        else:
            collector.send("unmatched", envelope.key, {"ts": ts})

    def expire(self, ts: float, collector: Collector) -> None:
        horizon = f"{int((ts - WINDOW) * 1000):015d}"
        with self.expiry.range(None, horizon) as old:
            keys = [key for key, _ in old]
        for key in keys:
            impression_id = key.split("|", 1)[1]
            impression = self.impressions.get(impression_id)
            if impression is not None:
                collector.send("expired", impression_id, {"ad": impression["ad"]})
                self.impressions.delete(impression_id)
        self.expiry.delete_all(keys)
