import tempfile
from pathlib import Path

from localstate.changelog.memory import MemoryChangelogPartition
from localstate.core.engine import StoreContext
from localstate.core.serdes import JsonSerde, StringSerde
from localstate.engines.kv import KeyValueEngineFactory
from localstate.testing.time import ManualTime

factory = KeyValueEngineFactory()
options = factory.validate_options("sessions", {"backend": "rocksdb", "ttl": "10s"})
clock = ManualTime(processing_time=1_000.0)     # the runtime hands a store its partition's time
changelog = MemoryChangelogPartition()
ctx = StoreContext(job="demo", store="sessions", partition=0, directory=Path(tempfile.mkdtemp()),
                   options=options, key_serde=StringSerde(), value_serde=JsonSerde(), changelog=changelog,
                   time=clock)

with factory.create(ctx) as sessions:
    sessions.put("ann", {"pages": 3})             # expires at 1000 + 10
    sessions.flush()                              # commit; the store reads its time again: 1000
    clock.advance_processing_time(6)
    sessions.flush()                              # store time 1006
    sessions.put("bob", {"pages": 1})             # expires at 1006 + 10
    clock.advance_processing_time(4)
    print(sessions.get("ann"))                    # {'pages': 3}: the store time is still 1006
    sessions.flush()                              # store time 1010: ann has expired
    print(sessions.get("ann"), list(sessions.all()))   # None [('bob', {'pages': 1})]
    sessions.flush()                              # the sweep deletes ann: a tombstone in the changelog
    print([(r.key, r.value) for r in changelog.read() if r.value is None])  # [(b'ann', None)]
