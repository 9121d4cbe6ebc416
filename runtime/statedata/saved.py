"""Saved state: what a start from saved state reads, whatever keeps it.

:class:`SavedState` is the interface :func:`~.loader.load_savepoint` (and the stores' sources,
:class:`~.sources.StoreSource`) read through: a :class:`~.manifest.SavepointManifest` describing the
state (the job, its partition count and partitioner, its stores, each partition's checkpoint, its
inputs' places and lags) and each store partition's raw records. Two kinds implement it:

* :class:`~.reader.Savepoint`: a savepoint's Parquet files at a location (checked against its
  manifest);
* :class:`~.durable.DurableState`: a stopped job's committed state, read in place from its
  changelogs at its checkpoints (what ``localstate rescale`` starts from: no savepoint in between).

Implementations are read-only: reading saved state never changes it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, Iterator

from localstate.core.config import JobConfig, StoreConfig
from localstate.core.policy import PluginPolicy
from localstate.runtime.statedata.manifest import SavepointManifest

__all__ = ["SavedState"]


class SavedState(ABC):
    """A job's saved state: :attr:`manifest`, and each store partition's raw records."""

    manifest: SavepointManifest
    """what the state holds; its ``files`` are those of a savepoint (none for state read in place)"""

    @abstractmethod
    def where(self) -> str:
        """Where the state is, for messages and the epoch pointer's ``source``."""

    @abstractmethod
    def records(self, store: str, partition: int) -> Iterator[tuple[list[bytes], list[bytes]]]:
        """The raw records of a store partition (the key and value bytes as the store's engine
        stores them), in chunks of two equally long lists; no key appears twice. Raises a typed
        error (never yields a partial result silently) when the records cannot be read whole."""

    def entries(self, store: str, partition: int) -> list[tuple[bytes, bytes]]:
        """All raw records of a store partition, in key byte order."""
        out: list[tuple[bytes, bytes]] = []
        for keys, values in self.records(store, partition):
            out.extend(zip(keys, values))
        out.sort()
        return out

    def store_config(self, store: str) -> StoreConfig:
        """The store as the saved job configured it."""
        entry = self.manifest.stores[store]
        return StoreConfig(store, entry.engine, entry.options, store, entry.key_serde, entry.value_serde)

    def job_config(self, plugins: str | None = None) -> Any:
        """A job config holding the saved job as it was (its name, partition count and stores), for
        readers that decode its records; nothing of it runs."""
        manifest = self.manifest
        policy = PluginPolicy.discover(plugins) if plugins else PluginPolicy()
        return JobConfig(name=manifest.job, partitions=manifest.partitions, task="unused:Unused",
                         state_dir=Path("."), stores={name: self.store_config(name) for name in manifest.stores},
                         policy=policy)
