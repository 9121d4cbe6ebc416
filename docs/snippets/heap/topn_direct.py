import tempfile
from pathlib import Path

from localstate.changelog.memory import MemoryChangelogPartition
from localstate.core.engine import StoreContext
from localstate.core.serdes import StringSerde, JsonSerde
from localstate.engines.heap import HeapEngineFactory

factory = HeapEngineFactory()
options = factory.validate_options("trending", {"order": "max", "capacity": 3})
context = StoreContext(job="demo", store="trending", partition=0, directory=Path(tempfile.mkdtemp()),
                       options=options, key_serde=StringSerde(), value_serde=JsonSerde(),
                       changelog=MemoryChangelogPartition())
top = factory.create(context)
for page, views in [("/a", 10), ("/b", 30), ("/c", 20), ("/d", 5)]:
    top.push(page, views, {"title": page.upper()})   # "/d" is evicted by capacity = 3 (push returns it)
top.push("/a", 40)                                    # re-pushing updates the score
print([(e.item, e.score) for e in top.top(2)])        # [('/a', 40.0), ('/b', 30.0)]
top.flush()                                           # commit: one changelog record per changed item
top.close()
