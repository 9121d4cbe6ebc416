# acme_dict/__init__.py
from localstate import Option, StorageEngine, StorageEngineFactory


class DictEngine(StorageEngine):
    """A dict, rebuilt from its changelog on every start."""

    def __init__(self, context):
        super().__init__(context)
        self.data, self.pending = {}, {}

    # Your query API: whatever suits the data structure.
    def put(self, key, value):
        raw = self.context.key_serde.serialize(key)
        self.data[raw] = self.pending[raw] = self.context.value_serde.serialize(value)

    def get(self, key):
        raw = self.data.get(self.context.key_serde.serialize(key))
        return None if raw is None else self.context.value_serde.deserialize(raw)

    # The contract.
    def restore(self, records):              # last record per key wins; None deletes
        for r in records:
            if r.value is None:
                self.data.pop(r.key, None)
            else:
                self.data[r.key] = r.value

    def flush(self):                         # one record per changed key, then make it durable
        self.context.changelog.append_many(self.pending.items())
        self.pending.clear()
        self.context.changelog.flush()

    def local_offset(self):
        return None                          # nothing on disk: always rebuilt from the changelog

    def close(self):
        self.data = None


class DictEngineFactory(StorageEngineFactory):
    description = "in-memory dict"
    options = {"initial_capacity": Option(int, default=0, minimum=0)}

    def create(self, context):
        return DictEngine(context)
