from localstate import StreamTask

IDLE = 60 * 60.0  # a user is idle after an hour of event time without a click


class IdleUsers(StreamTask):
    """Sends each user to "idle" once idle, from a timer namespace of its own (no on_timer)."""

    def init(self, context):
        self.last = context.kv("last_click")  # user -> the event time of their last click
        self.idle = context.timers.namespace("idle", self.went_idle, key_serde="string")

    def process(self, envelope, collector, coordinator):
        user, previous = envelope.key, self.last.get(envelope.key)
        if previous is not None:
            self.idle.delete_event_time(user, previous + IDLE)  # a click: the idle time moves
        self.idle.register_event_time(user, envelope.timestamp + IDLE)
        self.last.put(user, envelope.timestamp)

    def went_idle(self, user, timestamp, collector, coordinator):
        collector.send("idle", user, timestamp)
        self.last.delete(user)
