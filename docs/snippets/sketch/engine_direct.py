import tempfile
from pathlib import Path

import numpy as np

from localstate.changelog.memory import MemoryChangelogPartition
from localstate.core.engine import StoreContext
from localstate.core.serdes import BytesSerde, StringSerde
from localstate.engines.sketch import SketchEngineFactory

def open_store(directory, changelog, **options):
    factory = SketchEngineFactory()
    options = factory.validate_options("visitors", options)
    return factory.create(StoreContext("demo", "visitors", 0, Path(directory), options,
                                       StringSerde(), BytesSerde(), changelog))

changelog = MemoryChangelogPartition()
with tempfile.TemporaryDirectory() as tmp:
    store = open_store(tmp, changelog, kind="hll", precision=12)
    store.add("page-42", "alice")
    store.add_many("page-42", [f"user-{i}" for i in range(100_000)])
    print(round(store.count("page-42")))           # ~100000 (+- 1.6%)
    store.flush()                                   # logs <= 4096 register records + 1 meta record
    print(changelog.end_offset())
    hll = store.to_datasketch("page-42")            # a datasketch.HyperLogLog, same registers
    store.close()

    with tempfile.TemporaryDirectory() as other:    # rebuild elsewhere from the changelog
        copy = open_store(other, changelog, kind="hll", precision=12)
        copy.restore(changelog.read(0))
        assert np.array_equal(copy.registers("page-42"), hll.reg)
        copy.close()
