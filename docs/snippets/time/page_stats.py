"""Page statistics over event-time windows: one WindowedAggregation per store (docs/time/windows.md)."""

from __future__ import annotations

from typing import Any

from localstate import StreamTask
from localstate.windows import Hopping, Session, Tumbling, WindowedAggregation, count, quantiles, sum_of, top_n


# --8<-- [start:task]
class PageStats(StreamTask):
    def init(self, context):
        by_page = [
            # views per page per minute, sent again on every view (emit = "update")
            WindowedAggregation(context, Tumbling("1m"), count(), store="views", output="views", emit="update"),
            # bytes per page over the last 10 minutes, every minute; views up to 30 s late still count
            WindowedAggregation(context, Hopping("10m", "1m"), sum_of(lambda view: view["bytes"]), store="bytes",
                                output="bytes", lateness="30s"),
            # median and 99th percentile latency per page per minute (a KLL sketch per window)
            WindowedAggregation(context, Tumbling("1m"), quantiles([0.5, 0.99], lambda view: view["ms"]),
                                store="latency", output="latency"),
        ]
        # each user's 3 most viewed pages per session (a session ends after 5 idle minutes); late
        # views go to their own output instead of being dropped
        by_user = WindowedAggregation(context, Session("5m"), top_n(3, lambda view: view["page"]), store="pages",
                                      output="sessions", index_store="sessions", late_output="late-views")
        self.by_page, self.by_user = by_page, by_user

    def process(self, envelope, collector, coordinator):
        view = envelope.value
        for aggregation in self.by_page:
            aggregation.add(view["page"], view, envelope.timestamp, collector)
        self.by_user.add(envelope.key, view, envelope.timestamp, collector)
# --8<-- [end:task]


def views(n: int = 2000, seed: int = 3) -> list[tuple[str, dict[str, Any], float]]:
    """``(user, view, timestamp)``: ``n`` page views over about an hour, out of order by up to 40 s,
    and one in 50 by 10 minutes (late for most windows)."""
    import random

    rng = random.Random(seed)
    out = []
    for i in range(n):
        ts = 1_700_000_000.0 + i * 1.8 + rng.uniform(-40, 0) - (600.0 if i % 50 == 49 else 0.0)
        page = f"/p/{rng.randrange(6)}"
        out.append((f"u{rng.randrange(200)}", {"page": page, "bytes": rng.randrange(100, 5000),
                                               "ms": rng.randrange(1, 900), "ts": ts}, ts))
    return out
