import tempfile
from pathlib import Path
from localstate.changelog.memory import MemoryChangelogPartition
from localstate.core.engine import StoreContext
from localstate.core.serdes import BytesSerde, StringSerde
from localstate.engines.search import SearchEngineFactory

factory = SearchEngineFactory()
options = factory.validate_options("articles", {"fields": {
    "title": {"type": "text", "stored": True, "tokenizer": "en_stem"},
    "body": {"type": "text", "required": True},
    "year": {"type": "int", "stored": True, "fast": True}}})
changelog = MemoryChangelogPartition()
context = StoreContext("demo", "articles", 0, Path(tempfile.mkdtemp()), options,
                       StringSerde(), BytesSerde(), changelog)
store = factory.create(context)

store.add("a1", {"title": "Running with the wolves", "body": "Wolves run in packs.", "year": 2004})
store.add("a2", {"title": "Cats", "body": "Cats sleep most of the day.", "year": 1999})
print(store.get("a1"))                 # read-your-writes: visible before flush
print(store.search("run"))             # [] : search sees flushed state only
store.flush()                          # log, flush the changelog, commit the index
for hit in store.search("run AND year:[2000 TO 2010]"):
    print(hit.doc_id, round(hit.score, 3), hit.fields)   # a1 ... {'title': ..., 'year': 2004}
print(store.count("*"), store.local_offset())             # 2 2
store.close()
