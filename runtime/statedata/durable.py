"""A job's committed state read in place: the saved state ``localstate rescale`` starts from.

:class:`DurableState` is :class:`~.saved.SavedState` over the job's durable state itself: each
partition's latest committed checkpoint and, per logged store (the timer store included), the
changelog up to that checkpoint's offset, coalesced to the last record per key, tombstones dropped
(on the objectstore system: the snapshot and deltas the checkpoint's manifest names). It reads
exactly what a savepoint of the job would hold (:func:`~.writer.take_savepoint` reads with the same
functions), without writing it anywhere first: a rescale reads the state once, not a second time as
Parquet files.

Guarantees: read-only (nothing created or changed in the job's state); every store partition is read
at the checkpoint the manifest recorded for its partition when the state was opened, or refused with
:class:`~localstate.errors.FencedError` (a run committed meanwhile: the caller must keep the job
stopped, as ``rescale`` does with its partition locks); a changelog compacted while it is read is
read again (:func:`~.writer.read_partition`).
"""

from __future__ import annotations

from typing import Iterator

from localstate.core.config import JobConfig, StoreConfig
from localstate.errors import FencedError
from localstate.runtime.driver.views import load_checkpoints
from localstate.runtime.statedata.manifest import SavepointManifest
from localstate.runtime.statedata.saved import SavedState
from localstate.runtime.statedata.writer import ROWS_PER_FILE, logged_stores, read_partition, savepoint_manifest

__all__ = ["DurableState"]


class DurableState(SavedState):
    """``job``'s committed state (at the epoch it is bound to), read in place (see the module
    docstring). Open it with :meth:`open`."""

    def __init__(self, job: JobConfig, manifest: SavepointManifest, stores: dict[str, StoreConfig]) -> None:
        self.job = job
        self.manifest = manifest
        self.stores = stores

    @classmethod
    def open(cls, job: JobConfig) -> "DurableState":
        """The job's committed state as of now: its checkpoints are read here, once; the records are
        read when asked for (:meth:`records`), at those checkpoints."""
        stores = logged_stores(job)
        manifest = savepoint_manifest(job, stores, load_checkpoints(job))
        return cls(job, manifest, {config.name: config for config in stores})

    def where(self) -> str:
        return f"the committed state of job {self.job.name!r} (epoch {self.job.epoch})"

    def records(self, store: str, partition: int) -> Iterator[tuple[list[bytes], list[bytes]]]:
        """The store partition's committed records, in key byte order, in chunks of at most
        :data:`~.writer.ROWS_PER_FILE` (the savepoint's file size: what routing holds at a time)."""
        checkpoint, contents = read_partition(self.job, [self.stores[store]], partition)
        if checkpoint != self.manifest.checkpoints[partition]:
            # the job was to stay stopped: its state is no longer the one the manifest describes
            raise FencedError(f"partition {partition} of job {self.job.name!r} committed a new checkpoint while its "
                              "state was read", job=self.job.name, partition=partition,
                              hint="stop every run of the job, then try again")
        keys, values = contents[store]
        if not keys:  # as a savepoint: an empty store partition has no records, not an empty chunk
            return
        if len(keys) <= ROWS_PER_FILE:
            yield keys, values
            return
        for start in range(0, len(keys), ROWS_PER_FILE):
            yield keys[start:start + ROWS_PER_FILE], values[start:start + ROWS_PER_FILE]
