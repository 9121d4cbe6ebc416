"""Table-table join: keep both tables in local stores; whenever either side of a user changes and
both sides exist, write the joined row. The joined store's changelog doubles as the output."""

from __future__ import annotations

from localstate.core.task import Collector, Coordinator, Envelope, StreamTask, TaskContext


class ProfileSettingsJoin(StreamTask):
    def init(self, context: TaskContext) -> None:
        self.tables = {"profiles": context.store("profiles"), "settings": context.store("settings")}
        self.users = context.store("users")

    def process(self, envelope: Envelope, collector: Collector, coordinator: Coordinator) -> None:
        self.tables[envelope.stream].put(envelope.key, envelope.value)
        profile = self.tables["profiles"].get(envelope.key)
        settings = self.tables["settings"].get(envelope.key)
        if profile is not None and settings is not None:
            self.users.put(envelope.key, {"name": profile["name"], "zip": profile["zip"],
                                          "theme": settings["theme"], "emails": settings["emails"]})
