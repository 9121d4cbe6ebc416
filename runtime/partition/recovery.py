"""Bring one store partition back to exactly its checkpointed state.

Given the store's local offset L, the checkpointed changelog offset C and the changelog end E:

1. replay changelog records ``[min(L, C), C)`` through ``engine.restore`` (L unknown: from 0);
2. if ``E > C`` (records written after the last checkpoint, by a crashed or stale instance), *trim*:
   for every key written in ``[C, E)`` append its value as of C (its last record before C, or a
   tombstone) to the changelog, and apply the same records to the engine; a later restore can then
   never see the uncommitted values (Samza's transactional-state trim);
3. ``engine.flush()``: local state is durable and records the new end offset.

A store whose local offset L is below the changelog's *compaction horizon* (1 + the highest offset of
a tombstone that compaction dropped; optional capability ``changelog.compaction_horizon()``, 0 when a
system does not offer it) is *stale*: replaying ``[L, C)`` would miss that delete and the key would come
back. Such local state must be discarded and rebuilt from offset 0 (:func:`is_stale`; the runtime does
it when it opens the store); :func:`recover_store` refuses a stale store with RestoreError.

Correctness rests on the engine contract in :mod:`localstate.core.engine`: local state is the
changelog state at L plus only changes that are in the changelog after L, and the changelog is
compactable, so re-applying the checkpointed value of every key touched after C yields the state at C.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable, Iterable

from localstate.core.changelog import ChangelogPartition, ChangelogRecord
from localstate.core.engine import ColumnRestore, StorageEngine
from localstate.runtime.partition.restore_progress import RestoreProgress, columns_progress, restore_progress
from localstate.errors import CheckpointError, RestoreError

__all__ = ["StoreRecovery", "recover_store", "values_at", "compaction_horizon", "is_stale"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StoreRecovery:
    """What recovering one store partition did."""

    store: str
    partition: int
    local_offset: int | None
    checkpoint_offset: int
    replayed: int
    trimmed: int
    end_offset: int
    seconds: float

    @property
    def status(self) -> str:
        if self.local_offset == self.checkpoint_offset and not self.trimmed:
            return "ready"
        if self.local_offset is None:
            return "rebuilt"
        return "replayed" if not self.trimmed else "trimmed"


def values_at(changelog: ChangelogPartition, keys: Iterable[bytes], offset: int) -> dict[bytes, bytes | None]:
    """The value of each key as of ``offset``: its last record before ``offset``, else None."""
    values: dict[bytes, bytes | None] = dict.fromkeys(keys)
    for run in changelog.read_columns(0, offset):
        for key, value in zip(run.keys, run.values):
            if key in values:
                values[key] = value
    return values


def compaction_horizon(changelog: ChangelogPartition) -> int:
    """The changelog's compaction horizon (see the module docstring); 0 if the system has none."""
    horizon = getattr(changelog, "compaction_horizon", None)
    return int(horizon()) if callable(horizon) else 0


def is_stale(local_offset: int | None, changelog: ChangelogPartition) -> bool:
    """True if local state at ``local_offset`` may hold keys whose delete compaction has dropped."""
    return local_offset is not None and local_offset < compaction_horizon(changelog)


def recover_store(engine: StorageEngine, changelog: ChangelogPartition, checkpoint_offset: int,
                  *, label: str, discard: Callable[[], StorageEngine] | None = None) -> StoreRecovery:
    """Restore ``engine`` to the changelog state at ``checkpoint_offset`` and trim what follows it.

    Local state ahead of the changelog's end, or older than its compaction horizon, is never trusted:
    ``discard`` (empty the store and return the reopened engine) is called and the store is rebuilt
    from offset 0; without ``discard`` either case is a RestoreError."""
    context = engine.context
    end = changelog.end_offset()
    if checkpoint_offset > end:
        raise CheckpointError(
            f"the checkpoint says changelog {changelog.stream!r} reached offset {checkpoint_offset}, but the "
            f"changelog ends at {end}: committed changelog records are missing",
            store=context.store, partition=context.partition, offset=checkpoint_offset,
            hint="restore the changelog from a backup, or reset the job with `localstate reset` "
                 "to rebuild state from the inputs")
    local = engine.local_offset()
    if local is not None and local > end:
        # The changelog lost records local state already holds (e.g. its unsynced tail in a machine
        # crash with fsync = false): those updates are not committed, would stay visible and be applied
        # twice when the input is re-delivered. Local state is a cache: rebuild it from the changelog.
        log.warning("store %s partition %d: local state is at changelog offset %d but the changelog %r ends at "
                    "%d; discarding local state and rebuilding it from the changelog", context.store,
                    context.partition, local, changelog.stream, end)
        if discard is None:
            raise RestoreError(
                f"local state of store {context.store!r} is ahead of its changelog ({local} > {end})",
                store=context.store, partition=context.partition, offset=local,
                hint="delete the store's local directory; it is rebuilt from the changelog")
        engine, local = discard(), None
    if is_stale(local, changelog) and discard is not None:
        log.warning("store %s partition %d: local state (offset %d) is older than the compaction horizon %d of "
                    "%r; rebuilding it from the changelog", context.store, context.partition, local,
                    compaction_horizon(changelog), changelog.stream)
        engine, local = discard(), None
    if is_stale(local, changelog):
        raise RestoreError(
            f"local state of the store is at changelog offset {local}, below the compaction horizon "
            f"{compaction_horizon(changelog)} of {changelog.stream!r}: a delete it has not seen is no longer in "
            "the changelog", store=context.store, partition=context.partition, offset=local,
            path=str(context.directory),
            hint="discard the store's local directory and restore again (the runtime does this itself); "
                 "keep tombstone_retention longer than a store may stay offline")
    start = 0 if local is None else min(local, checkpoint_offset)
    progress = RestoreProgress(label, checkpoint_offset - start)
    if isinstance(engine, ColumnRestore):  # the bulk path: records decoded straight into columns
        engine.restore_columns(columns_progress(changelog.read_columns(start, checkpoint_offset), progress))
    else:
        engine.restore(restore_progress(changelog.read(start, checkpoint_offset), progress))
    seconds = progress.close()
    if is_stale(local, changelog):
        # A compaction that ran during the replay dropped a tombstone the replay may have missed.
        raise RestoreError(
            f"compaction of {changelog.stream!r} dropped a delete while the store replayed from offset {local}",
            store=context.store, partition=context.partition, offset=local, path=str(context.directory),
            hint="open the store again: its local state is then rebuilt from the changelog")
    trimmed = 0
    # A changelog may end past the checkpoint with no data records there (Kafka's transaction
    # markers take offsets): then there is nothing to neutralise.
    touched = sorted({r.key for r in changelog.read(checkpoint_offset, end)}) if end > checkpoint_offset else []
    if touched:
        committed = values_at(changelog, touched, checkpoint_offset)
        base = end
        trim = [ChangelogRecord(key, committed[key], base + i) for i, key in enumerate(touched)]
        changelog.append_many((record.key, record.value) for record in trim)
        engine.restore(trim)
        trimmed = len(trim)
        log.warning("store %s partition %d: neutralised %d uncommitted changelog record(s) at offsets %d..%d "
                    "by re-writing the checkpointed value of %d key(s)", context.store, context.partition,
                    end - checkpoint_offset, checkpoint_offset, end - 1, trimmed)
    engine.flush()
    return StoreRecovery(context.store, context.partition, local, checkpoint_offset, progress.records, trimmed,
                         changelog.end_offset(), seconds)
