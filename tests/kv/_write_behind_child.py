"""Child process of test_write_behind_crash.py: a write-behind kv store on a fsynced file changelog.
Commits round 1 normally, then makes the backend's next write block forever, puts round 2 and
flushes: flush() returns once round 2 is durable in the changelog while its backend write hangs.
Prints ``committed <end offset>`` after each flush and ``blocked`` once the write has started."""

import sys
import threading
from pathlib import Path

from localstate.changelog.file import FileChangelogSystem
from localstate.core.engine import StoreContext
from localstate.core.serdes import IntSerde, StringSerde
from localstate.engines.kv import KeyValueEngineFactory

workdir, backend, n_keys = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
system = FileChangelogSystem({"path": str(workdir / "changelog"), "fsync": True}, workdir)
system.ensure_stream("wb", 1)
changelog = system.partition("wb", 0)
factory = KeyValueEngineFactory()
options = factory.validate_options("wb", {"backend": backend, "write_behind": True, "cache_size": 10})
kv = factory.create(StoreContext("job", "wb", 0, workdir / "store", options, StringSerde(), IntSerde(), changelog))

kv.put_all((f"key-{i:05d}", 1) for i in range(n_keys))
kv.flush()
kv._logged.settle()  # round 1 is in the backend too
print(f"committed {changelog.end_offset()}", flush=True)

real_write = kv.backend._write
never = threading.Event()


def hang(*args, **kwargs):
    print("blocked", flush=True)
    never.wait()


kv.backend._write = hang
for i in range(n_keys):
    if i % 3:
        kv.put(f"key-{i:05d}", 2)
    else:
        kv.delete(f"key-{i:05d}")
kv.flush()
print(f"committed {changelog.end_offset()}", flush=True)
never.wait()
