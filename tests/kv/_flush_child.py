"""Child process for the kill -9 test: rewrites every key with the round number, then flushes,
forever. Prints ``flushing <round>`` just before each flush and ``flushed <round>`` after it."""

import sys
from pathlib import Path

from localstate.changelog.memory import MemoryChangelogPartition
from localstate.core.engine import StoreContext
from localstate.core.serdes import BytesSerde
from localstate.engines.kv import KeyValueEngineFactory

directory, backend, n_keys = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
factory = KeyValueEngineFactory()
options = factory.validate_options("crash", {"backend": backend, "write_batch_size": n_keys + 1,
                                             "cache_size": 10})
changelog = MemoryChangelogPartition()
kv = factory.create(StoreContext("job", "crash", 0, directory, options, BytesSerde(), BytesSerde(), changelog))
padding = b"." * 1000
round_ = 0
while True:
    round_ += 1
    prefix = b"%08d" % round_
    kv.put_all((b"key-%06d" % i, prefix + padding) for i in range(n_keys))
    print(f"flushing {round_}", flush=True)
    kv.flush()
    print(f"flushed {round_}", flush=True)
