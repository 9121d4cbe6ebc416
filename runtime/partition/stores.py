"""The stores of one task partition: open each, bring it back to exactly the committed checkpoint,
keep the cluster-mode attempt markers, flush them at commit, and give the checkpoint what it
records of them (changelog offsets, manifests, state formats). Kafka Streams'
``ProcessorStateManager`` and Samza's ``TaskStorageManager`` do the same work.

Local state is a cache of the changelog: whatever is found damaged, stale, ahead of its changelog,
or written by an attempt the driver did not commit is thrown away in one place
(:meth:`StoreSet._rebuild`) and rebuilt from the changelog.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from localstate.core.changelog import (ChangelogPartition, ChangelogSystem, DeferredDurability, ManifestedChangelog,
                                       NullChangelogWriter)
from localstate.core.checkpoint import Checkpoint, CheckpointStore
from localstate.core.config import JobConfig
from localstate.core.corruption import wipe_local
from localstate.core.engine import StateFormat, StorageEngine, StoreContext, TimedStore
from localstate.core.fsutil import ensure_dir, os_error, read_nofollow, write_atomic
from localstate.core.names import safe_join
from localstate.core.time import TIMER_STORE, TimeSource
from localstate.errors import ConfigError, StoreCorruptError, StoreIOError
from localstate.runtime.layout import check_no_history, checkpoint_where, epoch_parts, store_directory
from localstate.runtime.partition.faults import crash_point
from localstate.runtime.partition.recovery import StoreRecovery, compaction_horizon, is_stale, recover_store

__all__ = ["PartitionStore", "StoreSet"]

log = logging.getLogger(__name__)


@dataclass
class PartitionStore:
    """One open store partition: its engine and, if logged, its changelog partition."""

    name: str
    engine: StorageEngine
    changelog: ChangelogPartition | None


class StoreSet(Mapping[str, PartitionStore]):
    """Every store of one task partition (the job's stores and, with timers, the timer store), by
    name. Not thread safe: the partition's one driving thread uses it."""

    def __init__(self, job: JobConfig, partition: int, changelogs: ChangelogSystem, checkpoints: CheckpointStore,
                 local_root: Path, attempt: str | None, time: TimeSource) -> None:
        self.job = job
        self.partition = partition
        self.changelogs = changelogs
        self.checkpoints = checkpoints
        self.local_root = local_root
        self.attempt = attempt
        """cluster mode: this attempt's id, recorded next to each store it recovered (see :meth:`open`)"""
        self.time = time
        self._stores: dict[str, PartitionStore] = {}
        self.recoveries: list[StoreRecovery] = []

    # -- the Mapping --------------------------------------------------------------------------------
    def __getitem__(self, name: str) -> PartitionStore:
        return self._stores[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._stores)

    def __len__(self) -> int:
        return len(self._stores)

    def task_stores(self) -> dict[str, StorageEngine]:
        """The engines the task sees (``context.stores``): every store but the timer store."""
        return {name: store.engine for name, store in self._stores.items() if name != TIMER_STORE}

    # -- open and recover ---------------------------------------------------------------------------
    def open(self, checkpoint: Checkpoint | None) -> list[StoreRecovery]:
        """Open every store and recover each logged one to exactly ``checkpoint`` (None: the
        partition has never committed, so every changelog must be empty). Cluster mode: then record
        this attempt as the writer of each store's local state."""
        manifests = checkpoint.manifests if checkpoint is not None else {}
        committed_attempt = checkpoint.attempt if checkpoint is not None else None
        formats = checkpoint.formats if checkpoint is not None else {}
        for name, config in self.job.stores.items():
            self._stores[name] = self._open_store(name, config, manifests.get(name), committed_attempt,
                                                  formats.get(name))
        if checkpoint is None:
            self._check_fresh()
        else:
            self._check_state_formats(checkpoint.formats)
        for name, store in self._stores.items():
            if store.changelog is None:
                store.engine.flush()
                continue
            if checkpoint is not None and name not in checkpoint.changelogs:
                # A store new to the job starts empty; one whose changelog holds records is refused.
                check_no_history(store.changelog, store=name, partition=self.partition, entry_only=True,
                                 checkpoint_where=checkpoint_where(self.checkpoints, self.partition))
            offset = checkpoint.changelogs.get(name, 0) if checkpoint is not None else 0
            self.recoveries.append(self._recover(name, store, offset))
        if self.attempt is not None:
            for name in self._stores:  # from here on, this attempt writes the local state
                marker = self._attempt_marker(name)
                try:
                    ensure_dir(self.local_root, marker.parent)
                except OSError as exc:
                    raise os_error(exc, "create the directory", marker.parent, StoreIOError, store=name,
                                   partition=self.partition) from exc
                write_atomic(marker, self.attempt.encode(), error=StoreIOError)
        return self.recoveries

    def _open_store(self, name: str, config: Any, manifest: dict[str, Any] | None,
                    committed_attempt: str | None, state_format: str | None = None) -> PartitionStore:
        registry = self.job.registry
        factory = registry.engine_factory(config.engine)
        changelog = None
        if config.changelog is not None:
            self.changelogs.ensure_stream(config.changelog, self.job.partitions)
            changelog = self.changelogs.partition(config.changelog, self.partition)
            if isinstance(changelog, ManifestedChangelog):
                # The checkpoint, not the storage, says which objects hold committed records.
                changelog.adopt(manifest)
        directory = store_directory(self.job, name, self.partition, self.local_root)
        try:
            ensure_dir(self.local_root, directory)
        except OSError as exc:
            raise os_error(exc, "create the store directory", directory, StoreIOError, store=name,
                           partition=self.partition) from exc
        context = StoreContext(
            job=self.job.name, store=name, partition=self.partition, directory=directory, options=config.options,
            key_serde=registry.serde(config.key_serde, allow_pickle=self.job.allow_pickle),
            value_serde=registry.serde(config.value_serde, allow_pickle=self.job.allow_pickle),
            changelog=changelog if changelog is not None else NullChangelogWriter(), logged=changelog is not None,
            # backends are found through the job's plugin policy; state_format: the layout the committed
            # checkpoint recorded (an engine may trust its state to be in it, see _check_state_formats)
            extra={"registry": registry, "state_format": state_format}, time=self.time)
        had_files = any(directory.iterdir())
        if self.attempt is None:
            # This instance writes the store without an attempt id (local mode): no attempt may later
            # take what it leaves as its own (a local-mode job sharing a cluster job's local_dir).
            self._forget_attempt(name)
        if had_files and changelog is not None and self.attempt is not None \
                and self._last_attempt(name) != committed_attempt:
            # Written by an attempt the driver did not commit (or not last): its offsets may match the
            # checkpoint's while its content does not. Local state is a cache: rebuild it.
            wipe_local(directory, "store", "it was last written by a task attempt that is not the committed one",
                       store=name, partition=self.partition)
            had_files = False
        try:
            engine = factory.create(context)
        except StoreCorruptError as exc:
            if changelog is None:
                raise
            engine = self._rebuild(factory, context, None, f"local state is damaged ({exc.message})")
        if changelog is not None and engine.local_offset() is None and had_files:
            # Unusable local state: start from an empty directory so stale keys cannot survive.
            engine = self._rebuild(factory, context, engine, "local state is unusable")
        if changelog is not None and is_stale(engine.local_offset(), changelog):
            # Compaction dropped a tombstone this state has not applied: replaying only the tail would
            # bring the deleted key back.
            engine = self._rebuild(factory, context, engine,
                                   f"local state (offset {engine.local_offset()}) is older than the changelog's "
                                   f"compaction horizon {compaction_horizon(changelog)}")
        return PartitionStore(name, engine, changelog)

    def _recover(self, name: str, store: PartitionStore, offset: int) -> StoreRecovery:
        """Recover ``store`` to changelog ``offset``; local state found damaged on the way is discarded
        and the store rebuilt from the changelog, once."""
        discard: Callable[[], StorageEngine] = lambda: self._discard_local(name)  # noqa: E731
        label = f"{name}[{self.partition}]"
        try:
            return recover_store(store.engine, store.changelog, offset, label=label, discard=discard)
        except StoreCorruptError as exc:
            log.warning("store %s partition %d: %s; rebuilding it from the changelog", name, self.partition,
                        exc.message)
            return recover_store(discard(), store.changelog, offset, label=label, discard=discard)

    def _discard_local(self, name: str) -> StorageEngine:
        """Close store ``name``, empty its directory and open it again, empty (recovery replays it)."""
        store = self._stores[name]
        factory = self.job.registry.engine_factory(self.job.stores[name].engine)
        store.engine = self._rebuild(factory, store.engine.context, store.engine, None)
        return store.engine

    def _rebuild(self, factory: Any, context: StoreContext, engine: StorageEngine | None,
                 reason: str | None) -> StorageEngine:
        """The one way local state is thrown away: close ``engine``, empty the store's directory and
        open a fresh, empty engine there (recovery then rebuilds it from the changelog). Local state
        is only a cache of the changelog."""
        if engine is not None:
            engine.close()
        wipe_local(context.directory, "state", reason, store=context.store, partition=context.partition)
        return factory.create(context)

    def _check_fresh(self) -> None:
        """No checkpoint: every logged store must be without records (see :func:`check_no_history`)."""
        where = checkpoint_where(self.checkpoints, self.partition)
        for name, store in self._stores.items():
            if store.changelog is not None:
                check_no_history(store.changelog, store=name, partition=self.partition, checkpoint_where=where)

    def _check_state_formats(self, recorded: Mapping[str, str]) -> None:
        """ConfigError if a store's engine lays out its state otherwise than the checkpoint recorded
        (:class:`StateFormat`: e.g. ``ttl`` added to or removed from a kv store's options), before
        anything reads the old state in the wrong layout."""
        for name, store in self._stores.items():
            now = store.engine.state_format if isinstance(store.engine, StateFormat) else None
            before = recorded.get(name)
            if before is not None and now is not None and before != now:
                raise ConfigError.at(
                    f"stores.{name}",
                    f"store {name!r} (partition {self.partition}) holds state committed in the {before!r} layout, "
                    f"but its options now give {now!r} (such as ttl added or removed): its state would be read "
                    f"in the wrong layout",
                    hint=f"put the store's options back as they were, or start store {name!r} over "
                         f"(`localstate reset`, or a new store name)")

    # -- attempt markers (cluster mode) --------------------------------------------------------------
    def _attempt_marker(self, store: str) -> Path:
        """``<root>/<job>/[epochs/<e>/]attempts/<store>/<partition>``: the attempt that last wrote this host's local
        state of the store partition (cluster mode), kept beside the stores, not inside them."""
        return safe_join(self.local_root, self.job.name, *epoch_parts(self.job.epoch), "attempts", store,
                         str(self.partition))

    def _forget_attempt(self, store: str) -> None:
        marker = self._attempt_marker(store)
        try:
            marker.unlink(missing_ok=True)  # a symlink is removed itself, never followed
        except OSError as exc:
            raise os_error(exc, "remove the attempt marker", marker, StoreIOError, store=store,
                           partition=self.partition) from exc

    def _last_attempt(self, store: str) -> str | None:
        try:
            return read_nofollow(self._attempt_marker(store)).decode("ascii", "replace")
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise os_error(exc, "read the attempt marker of", self._attempt_marker(store), StoreIOError,
                           store=store, partition=self.partition) from exc

    # -- commit ---------------------------------------------------------------------------------------
    @property
    def writes_in_background(self) -> bool:
        """Every logged store's changelog only starts its write at flush and names its objects in a
        manifest (:class:`DeferredDurability` and :class:`ManifestedChangelog`: the objectstore), so
        a commit can be pipelined; False without logged stores."""
        logged = [store.changelog for store in self._stores.values() if store.changelog is not None]
        return bool(logged) and all(isinstance(changelog, DeferredDurability)
                                    and isinstance(changelog, ManifestedChangelog) for changelog in logged)

    def flush(self) -> None:
        """Flush every store: local write, changelog records appended and durable (crash point
        ``mid_flush`` after the first store, ``after_flush`` after the last)."""
        for index, store in enumerate(self._stores.values()):
            store.engine.flush()
            if index == 0:
                crash_point("mid_flush")
        crash_point("after_flush")

    def refresh_time(self) -> None:
        """Make every store that reads its time once per commit (:class:`TimedStore`: a kv store with
        ttl) read the partition's time now."""
        for store in self._stores.values():
            if isinstance(store.engine, TimedStore):
                store.engine.refresh_time()

    def manifests(self, in_flight: bool) -> tuple[dict[str, dict[str, Any]], list[Callable[[], None]]]:
        """Each manifested changelog's manifest. ``in_flight``: a :class:`DeferredDurability` changelog's
        is taken without waiting, and the wait to do before a checkpoint naming it may be saved is
        returned beside it."""
        manifests: dict[str, dict[str, Any]] = {}
        waits: list[Callable[[], None]] = []
        for name, store in self._stores.items():
            changelog = store.changelog
            if in_flight and isinstance(changelog, DeferredDurability):
                taken = changelog.in_flight_manifest()
                manifests[name] = taken.manifest
                waits.append(taken.durable)
            elif isinstance(changelog, ManifestedChangelog):
                manifests[name] = changelog.manifest()
        return manifests, waits

    def changelog_offsets(self) -> dict[str, int]:
        """Each logged store's changelog end offset (what a checkpoint records)."""
        return {name: store.changelog.end_offset() for name, store in self._stores.items()
                if store.changelog is not None}

    def formats(self) -> dict[str, str]:
        """Each store's state layout, for engines that name one (:class:`StateFormat`)."""
        return {name: store.engine.state_format for name, store in self._stores.items()
                if isinstance(store.engine, StateFormat)}

    # -- close ----------------------------------------------------------------------------------------
    def close_all(self, attempt: Callable[[Callable[[], Any], str], None]) -> None:
        """Close every store and its changelog partition, each step through ``attempt`` (which keeps
        going whatever one step raises); the set is empty afterwards."""
        stores = list(self._stores.items())
        self._stores.clear()
        for name, store in stores:
            attempt(store.engine.close, f"closing store {name!r}")
            if store.changelog is not None:
                attempt(store.changelog.close, f"closing the changelog of store {name!r}")
