"""The heap engine (``engine = "heap"``): a changelog-replicated running top-N
(:class:`TopNEngine`, ``kind = "topn"``) and a bounded sort / reorder buffer
(:class:`ReorderBufferEngine`, ``kind = "reorder"``). Both keep their order in memory
(sortedcontainers) and persist on a kv engine backend (RocksDB, LMDB or memory), logging only the
changes coalesced since the previous flush."""

from localstate.engines.heap.factory import HeapEngineFactory
from localstate.engines.heap.options import HEAP_KINDS
from localstate.engines.heap.reorder import BufferedEvent, ReorderBufferEngine
from localstate.engines.heap.topn import Entry, TopNEngine
from localstate.errors import LateEventError

__all__ = ["HEAP_KINDS", "HeapEngineFactory", "TopNEngine", "ReorderBufferEngine", "Entry", "BufferedEvent",
           "LateEventError"]
