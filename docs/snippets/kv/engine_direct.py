import tempfile
from pathlib import Path

from localstate.changelog.memory import MemoryChangelogPartition
from localstate.core.engine import StoreContext
from localstate.core.serdes import IntSerde, StringSerde
from localstate.engines.kv import KeyValueEngineFactory

factory = KeyValueEngineFactory()
options = factory.validate_options("counts", {"backend": "rocksdb", "cache_size": 50_000})
changelog = MemoryChangelogPartition()          # the runtime normally hands you the file/kafka changelog
ctx = StoreContext(job="demo", store="counts", partition=0, directory=Path(tempfile.mkdtemp()),
                   options=options, key_serde=StringSerde(), value_serde=IntSerde(), changelog=changelog)

with factory.create(ctx) as counts:
    for word in "the cat and the hat and the bat".split():
        counts.put(word, (counts.get(word) or 0) + 1)
    counts.flush()                                # commit: 5 changelog records, one per word
    print(counts.get("the"), counts.local_offset())       # 3 5
    print(list(counts.prefix("b")))                      # [('bat', 1)]
    with counts.range("and", "the") as it:               # [start, end) in serialized-key order
        print(list(it))                                  # [('and', 2), ('bat', 1), ('cat', 1), ('hat', 1)]
    print([k for k, _ in counts.all(reverse=True)][:2])  # ['the', 'hat']
