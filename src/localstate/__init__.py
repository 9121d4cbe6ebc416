"""localstate: fast, fault-tolerant local state for stream processing on Spark.

The public surface, in two parts:

* for **task authors**: :class:`StreamTask`, :class:`BatchTask`, :class:`TaskContext`, :class:`Envelope`, :class:`Collector`,
  :class:`Coordinator`, :class:`KeyValueStore`, :class:`TaskTestDriver`, time (:class:`Timers`,
  :class:`TimerNamespace`, :class:`TimeSource`, :data:`EVENT_TIME`, :data:`PROCESSING_TIME`; windows in :mod:`localstate.windows`)
  and the errors in :mod:`localstate.errors`;
* for **plugin authors** (engines, changelog systems, stream systems, backends, serdes):
  :class:`StorageEngine`, :class:`StorageEngineFactory`, :class:`StoreContext` (and, for the state
  reader's typed columns, :class:`StateColumns`, :class:`SerdeColumn`), :class:`Option`,
  :class:`Serde`, the changelog contract (:class:`ChangelogSystem`, :class:`ChangelogPartition`,
  :class:`ChangelogWriter`, :class:`ChangelogRecord`), the stream contract (:class:`StreamSystem`,
  :class:`InputStream`, :class:`OutputStream`, :class:`InputRecord`, and the optional input protocols
  :class:`PendingTail`, :class:`RetainedStart` and :class:`IdentifiedInput`) and the backend contract
  (:class:`KVBackend`, :class:`DirectoryBackend`, :class:`SortedRun`, ``Item``).

Everything else is internal. See ``docs/`` for the architecture and guides.
"""

from importlib.metadata import PackageNotFoundError, version
from typing import Any

from localstate import errors
from localstate.core.backend import DirectoryBackend, Item, KVBackend, SortedRun
from localstate.core.changelog import ChangelogPartition, ChangelogRecord, ChangelogSystem, ChangelogWriter
from localstate.core.config import JobConfig, load_job_config
from localstate.core.engine import SerdeColumn, StateColumns, StorageEngine, StorageEngineFactory, StoreContext
from localstate.core.options import Option
from localstate.core.serdes import Serde
from localstate.core.stream import IdentifiedInput, InputRecord, InputStream, OutputStream, PendingTail, RetainedStart, \
    StreamSystem
from localstate.core.task import BatchTask, Collector, Coordinator, Envelope, KeyValueStore, StreamTask, TaskContext, \
    column_values
from localstate.core.time import EVENT_TIME, PROCESSING_TIME, TimerNamespace, TimeSource, Timers
from localstate.errors import LocalStateError

try:
    __version__ = version("localstate")
except PackageNotFoundError:  # running from a source tree without installing
    __version__ = "0.0.0+unknown"

__all__ = [
    "__version__",
    # task authors
    "StreamTask",
    "BatchTask",
    "column_values",
    "TaskContext",
    "KeyValueStore",
    "Envelope",
    "Collector",
    "Coordinator",
    "TaskTestDriver",
    "Timers",
    "TimerNamespace",
    "TimeSource",
    "EVENT_TIME",
    "PROCESSING_TIME",
    "LocalStateError",
    "errors",
    "JobConfig",
    "load_job_config",
    # plugin authors: engines
    "Option",
    "Serde",
    "StorageEngine",
    "StorageEngineFactory",
    "StoreContext",
    "StateColumns",
    "SerdeColumn",
    # plugin authors: changelog systems
    "ChangelogPartition",
    "ChangelogRecord",
    "ChangelogSystem",
    "ChangelogWriter",
    # plugin authors: stream systems (job inputs and outputs)
    "StreamSystem",
    "InputStream",
    "OutputStream",
    "InputRecord",
    "PendingTail",
    "RetainedStart",
    "IdentifiedInput",
    # plugin authors: storage backends
    "KVBackend",
    "DirectoryBackend",
    "SortedRun",
    "Item",
]


def __getattr__(name: str) -> Any:
    if name == "TaskTestDriver":
        # The test driver pulls in the whole runtime: imported only when a test asks for it.
        from localstate.testing.driver import TaskTestDriver

        return TaskTestDriver
    raise AttributeError(f"module 'localstate' has no attribute {name!r}")
