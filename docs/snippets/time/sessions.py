from localstate import StreamTask

GAP = 30 * 60.0  # a session ends after 30 minutes of event time without a click


class Sessions(StreamTask):
    """Counts each user's clicks per session and emits the count when the session ends."""

    def init(self, context):
        self.clicks = context.kv("clicks")      # user -> clicks in the open session
        self.ends = context.kv("session_end")   # user -> when the open session ends
        self.timers = context.timers

    def process(self, envelope, collector, coordinator):
        user, end = envelope.key, envelope.timestamp + GAP
        previous = self.ends.get(user)
        if previous is not None:
            self.timers.delete_event_time(user, previous)  # the session goes on: move its end
        self.timers.register_event_time(user, end)
        self.ends.put(user, end)
        self.clicks.put(user, (self.clicks.get(user) or 0) + 1)

    def on_timer(self, key, timestamp, collector, coordinator):
        collector.send("sessions", key, {"end": timestamp, "clicks": self.clicks.get(key)})
        self.clicks.delete(key)
        self.ends.delete(key)
