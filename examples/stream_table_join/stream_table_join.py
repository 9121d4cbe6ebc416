"""Stream-table join: profiles update a local table; each page view is joined with the user's
profile as of the page view's event time (inputs are merged in event-time order).

Written twice: per record (``EnrichWithZip``, the default in job.toml) and as a batch task
(``EnrichWithZipBatch``: set ``task = "stream_table_join:EnrichWithZipBatch"``). Both give the same
state and outputs."""

from __future__ import annotations

import pyarrow as pa

from localstate import BatchTask, column_values
from localstate.core.task import Collector, Coordinator, Envelope, StreamTask, TaskContext


class EnrichWithZip(StreamTask):
    def init(self, context: TaskContext) -> None:
        self.profiles = context.store("profiles")

    def process(self, envelope: Envelope, collector: Collector, coordinator: Coordinator) -> None:
        if envelope.stream == "profiles":
            self.profiles.put(envelope.key, envelope.value)
            return
        profile = self.profiles.get(envelope.key)
        collector.send("enriched-views", envelope.key, {"page": envelope.value["page"], "ts": envelope.timestamp,
                                                        "zip": profile["zip"] if profile else None})


class EnrichWithZipBatch(BatchTask):
    """:class:`EnrichWithZip` a batch at a time. The batch holds both inputs' rows in event-time
    order (the ``stream`` column says which): the profiles a view needs are read with one
    ``get_many``, a view sees the profile updates of earlier rows of the batch, and the batch's
    updates are written with one ``put_many`` (the last per user wins, as with one ``put`` per row)."""

    def init(self, context: TaskContext) -> None:
        self.profiles = context.store("profiles")

    def process_batch(self, batch: pa.RecordBatch, collector: Collector, coordinator: Coordinator) -> None:
        users, values = column_values(batch, "key"), column_values(batch, "value")
        if "stream" in batch.schema.names:
            streams = batch.column("stream").to_pylist()
        else:
            streams = [batch.schema.metadata[b"localstate.stream"].decode()] * batch.num_rows
        times = batch.column("timestamp").to_pylist()
        viewers = list(dict.fromkeys(u for u, s in zip(users, streams) if s != "profiles"))
        stored = dict(zip(viewers, self.profiles.get_many(viewers)))
        updated: dict[str, dict] = {}
        keys, enriched = [], []
        for user, value, stream, ts in zip(users, values, streams, times):
            if stream == "profiles":
                updated[user] = value
                continue
            profile = updated[user] if user in updated else stored[user]
            keys.append(user)
            enriched.append({"page": value["page"], "ts": ts, "zip": profile["zip"] if profile else None})
        if updated:
            self.profiles.put_many(list(updated), list(updated.values()))
        if keys:
            collector.send_batch("enriched-views", keys, enriched)
