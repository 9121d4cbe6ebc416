# toy_engine.py
import json
import os

from localstate import StorageEngine, StorageEngineFactory


class ToyDictEngine(StorageEngine):
    """A dict persisted as one JSON file {offset, data} at each flush, after the changelog."""

    def __init__(self, context):
        super().__init__(context)
        self.path = context.directory / "toy.json"
        self.data, self.pending, self.offset = {}, {}, None
        self.dirty = False
        if self.path.exists():
            saved = json.loads(self.path.read_text())
            self.offset = saved["offset"]
            self.data = {bytes.fromhex(k): bytes.fromhex(v) for k, v in saved["data"].items()}

    # The engine's own API.
    def put(self, key, value):
        raw = self.context.key_serde.serialize(key)
        self.data[raw] = self.pending[raw] = self.context.value_serde.serialize(value)

    def delete(self, key):
        raw = self.context.key_serde.serialize(key)
        self.data.pop(raw, None)
        self.pending[raw] = None

    def items(self):
        kd, vd = self.context.key_serde.deserialize, self.context.value_serde.deserialize
        return [(kd(k), vd(v)) for k, v in sorted(self.data.items())]

    # The contract.
    def restore(self, records):
        for record in records:
            if record.value is None:
                self.data.pop(record.key, None)
            else:
                self.data[record.key] = record.value
            self.pending.pop(record.key, None)
            self.dirty = True

    def flush(self):
        self.context.changelog.append_many(self.pending.items())
        end = self.context.changelog.flush()        # the changelog first ...
        if self.pending or self.dirty or end != self.offset:
            tmp = self.path.with_suffix(".tmp")      # ... then local state with its offset, atomically
            with open(tmp, "w") as f:
                json.dump({"offset": end, "data": {k.hex(): v.hex() for k, v in self.data.items()}}, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        self.pending.clear()
        self.dirty = False
        self.offset = end

    def local_offset(self):
        return self.offset

    def close(self):
        self.data = self.pending = None


class ToyDictFactory(StorageEngineFactory):
    description = "a dict in a JSON file (contract-suite example)"

    def create(self, context):
        return ToyDictEngine(context)
