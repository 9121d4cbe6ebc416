"""localstate: fast, fault-tolerant local state for stream processing on Spark.

The public surface is small; see ``docs/`` for the architecture and guides.
"""

from importlib.metadata import PackageNotFoundError, version

from localstate.core.changelog import ChangelogPartition, ChangelogRecord, ChangelogSystem, ChangelogWriter
from localstate.core.config import JobConfig, load_job_config
from localstate.core.engine import StorageEngine, StorageEngineFactory, StoreContext
from localstate.core.options import Option
from localstate.core.serdes import Serde

try:
    __version__ = version("localstate")
except PackageNotFoundError:  # running from a source tree without installing
    __version__ = "0.0.0+unknown"

__all__ = [
    "__version__",
    "ChangelogPartition",
    "ChangelogRecord",
    "ChangelogSystem",
    "ChangelogWriter",
    "JobConfig",
    "load_job_config",
    "Option",
    "Serde",
    "StorageEngine",
    "StorageEngineFactory",
    "StoreContext",
]
