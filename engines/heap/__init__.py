"""The heap engine (``engine = "heap"``): a changelog-replicated running top-N
(:class:`TopNEngine`, ``mode = "topn"``) and a bounded sort / reorder buffer
(:class:`ReorderBufferEngine`, ``mode = "reorder"``). Both keep their order in memory
(sortedcontainers) and persist through an inner key-value store on the same changelog."""

from localstate.engines.heap.base import LateEventError
from localstate.engines.heap.factory import HeapEngineFactory
from localstate.engines.heap.reorder import BufferedEvent, ReorderBufferEngine
from localstate.engines.heap.topn import Entry, TopNEngine

__all__ = ["HeapEngineFactory", "TopNEngine", "ReorderBufferEngine", "Entry", "BufferedEvent",
           "LateEventError"]
