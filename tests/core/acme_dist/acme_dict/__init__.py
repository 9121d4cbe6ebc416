"""A minimal third-party engine: a dict that logs every change and is rebuilt from its changelog."""

from localstate import Option, StorageEngine, StorageEngineFactory


class DictEngine(StorageEngine):
    def __init__(self, context):
        super().__init__(context)
        self.data = {}
        self.pending = {}

    # The engine's own query API.
    def put(self, key, value):
        raw = self.context.key_serde.serialize(key)
        self.data[raw] = self.pending[raw] = self.context.value_serde.serialize(value)

    def get(self, key):
        raw = self.data.get(self.context.key_serde.serialize(key))
        return None if raw is None else self.context.value_serde.deserialize(raw)

    # The contract.
    def restore(self, records):
        for record in records:
            if record.value is None:
                self.data.pop(record.key, None)
            else:
                self.data[record.key] = record.value

    def flush(self):
        self.context.changelog.append_many(self.pending.items())
        self.pending.clear()
        self.context.changelog.flush()

    def local_offset(self):
        return None  # nothing is kept on disk: always rebuilt from the changelog

    def close(self):
        self.data = None


class DictEngineFactory(StorageEngineFactory):
    description = "in-memory dict (acme)"
    options = {"initial_capacity": Option(int, default=0, minimum=0)}

    def create(self, context):
        return DictEngine(context)


class NotAFactory:
    pass


class OldApiFactory(DictEngineFactory):
    plugin_api = 0
