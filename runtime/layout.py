"""Where a job's state lives: its directory, its checkpoints, its local stores, and its changelog
system, all derived from the job config (every runtime and tool finds them here, never by path
arithmetic of its own), and the check that refuses to start a store empty while its changelog still
holds committed records.

Guarantee: every path returned stays inside the state directory (or ``local_dir``) of the job;
:func:`job_directory` creates the job's directory with localstate's ownership marker, which ``reset``
checks before it deletes anything.

*State epochs* (docs/state-as-data.md). Everything of one generation of a job's state is scoped by an
epoch number: its checkpoints (``<state_dir>/<job>/epochs/<e>/checkpoints``, or the changelog system's
durable storage), its local stores (``<root>/<job>/epochs/<e>/stores``) and its changelog streams
(``<stream>.e<e>``). Epoch 0 is the layout of a job never rescaled (no ``epochs/`` part, the streams'
own names). One small pointer, :class:`EpochPointer` (``<state_dir>/<job>/epoch.json``, or a job
object in the durable storage of a system offering :class:`EpochCheckpoints`), names the current
epoch; absent, it is 0. A rescale or a start from a savepoint writes a whole new epoch, then replaces
the pointer in one atomic write: until then the old epoch is untouched and runnable. A config is
bound to an epoch by :func:`resolve_epoch`; :func:`checkpoint_store` refuses a config bound to
another epoch than the current one (a run that started before the switch).
"""

from __future__ import annotations

import logging

import json
import os
import re
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from localstate.core.changelog import ChangelogPartition, ChangelogSystem, DurableCheckpoints, EpochCheckpoints, \
    ListedHistory, StreamLocations
from localstate.core.checkpoint import CheckpointStore
from localstate.core.config import JobConfig
from localstate.core.fsutil import make_owned_dir, read_nofollow, write_atomic
from localstate.core.names import safe_join
from localstate.errors import (CheckpointError, CheckpointIOError, FencedError, InputError, LocalStateError,
                               PartitionCountError, UnsafePathError)

__all__ = ["open_changelog_system", "create_changelog_streams", "store_root", "store_directory", "job_directory",
           "checkpoint_store", "check_no_history", "checkpoint_where", "MISSING_CHECKPOINT_HINT", "state_places",
           "EpochPointer", "EPOCH_OBJECT", "epoch_parts", "epoch_stream", "with_epoch", "read_epoch", "write_epoch",
           "resolve_epoch", "check_moved_inputs", "epoch_checkpoint_store", "epoch_checkpoint_objects", "state_directory"]

log = logging.getLogger(__name__)

EPOCH_OBJECT = "epoch.json"
"""The name of the epoch pointer (a file in ``<state_dir>/<job>``, or a job object in durable storage)."""


def open_changelog_system(job: JobConfig, name: str | None = None) -> ChangelogSystem:
    """Instantiate the job's changelog system (or ``name``) with its validated options."""
    name = name or job.changelog_system
    system_class = job.registry.changelog_system(name)
    return system_class(job.changelog_options.get(name, {}), job.state_dir)


def create_changelog_streams(job: JobConfig) -> None:
    """Create the job's stores' changelog streams, once, on the driver, rather than in the first
    batch's tasks all at the same time (creating a stream is idempotent, but concurrent creation is a
    race that can fail a task attempt)."""
    changelogs = open_changelog_system(job)
    try:
        for store in job.stores.values():
            if store.changelog is not None:
                changelogs.ensure_stream(store.changelog, job.partitions)
    finally:
        changelogs.close()


def store_root(job: JobConfig) -> Path:
    """Where the job's local stores live on this host when nothing else is said: ``job.local_dir``
    (environment variables expanded here, on this host) if set, else the state directory."""
    if job.local_dir is None:
        return job.state_dir
    return Path(os.path.abspath(os.path.expandvars(job.local_dir)))


def epoch_parts(epoch: int) -> tuple[str, ...]:
    """The path components of epoch ``epoch`` below a job's directory: none for epoch 0."""
    return () if epoch == 0 else ("epochs", str(int(epoch)))


def store_directory(job: JobConfig, store: str, partition: int, root: Path | None = None) -> Path:
    """``<root>/<job>/[epochs/<e>/]stores/<store>/<partition>`` (``root``: :func:`store_root` unless
    given), checked to stay inside ``root``."""
    return safe_join(store_root(job) if root is None else root, job.name, *epoch_parts(job.epoch), "stores", store,
                     str(partition))


def state_directory(job: JobConfig) -> Path:
    """``<state_dir>/<job>/[epochs/<e>]``: the directory of the config's epoch (checkpoints, the
    DataFrame step's outputs); not created."""
    return safe_join(job.state_dir, job.name, *epoch_parts(job.epoch))


def job_directory(job: JobConfig) -> Path:
    """``<state_dir>/<job>``, created with localstate's ownership marker (what ``reset`` checks
    before deleting it); refuses symlinks (UnsafePathError)."""
    return make_owned_dir(job.state_dir, safe_join(job.state_dir, job.name), "job", job=job.name,
                          layout=lambda entry: entry in ("checkpoints", "stores", "epochs", "savepoints", EPOCH_OBJECT))


def checkpoint_store(job: JobConfig) -> CheckpointStore:
    """The job's checkpoints at the config's epoch: in durable storage when its changelog system keeps
    them there (:class:`DurableCheckpoints`), else in ``<state_dir>/<job>/[epochs/<e>/]checkpoints``.
    Instance locks are always local files in that directory. Refuses (FencedError) a config bound to
    another epoch than the job's current one: its state moved (a rescale, a start from a savepoint)."""
    current = read_epoch(job)
    if current.epoch != job.epoch:
        raise _moved(job, current)
    return epoch_checkpoint_store(job)


def epoch_checkpoint_store(job: JobConfig) -> CheckpointStore:
    """The checkpoints of the config's epoch, current or not (what writes a new epoch uses)."""
    job_directory(job)
    objects = None
    if issubclass(job.registry.changelog_system(job.changelog_system), DurableCheckpoints):
        objects = epoch_checkpoint_objects(job, open_changelog_system(job))
    return CheckpointStore(safe_join(job.state_dir, job.name, *epoch_parts(job.epoch), "checkpoints"),
                           anchor=job.state_dir, objects=objects)


def epoch_checkpoint_objects(job: JobConfig, system: ChangelogSystem) -> Any:
    """The durable checkpoint objects of the config's epoch in ``system`` (a :class:`DurableCheckpoints`)."""
    if job.epoch == 0:
        return system.checkpoint_objects(job.name)  # type: ignore[attr-defined]
    if isinstance(system, EpochCheckpoints):
        return system.epoch_checkpoint_objects(job.name, job.epoch)
    raise _no_epochs(job)


# -- state epochs ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class EpochPointer:
    """Which epoch holds a job's state (see the module docstring)."""

    epoch: int = 0
    partitions: int | None = None
    """the partition count of the current epoch's state (None: epoch 0 of a job never moved)"""
    reserved: int = 0
    """the highest epoch number ever handed out: a new epoch takes the next, so the leftovers of an
    attempt that died are never reused"""
    previous: int | None = None
    """the epoch the current one replaced"""
    source: str = ""
    """what made the current epoch: ``rescale``, ``savepoint <path>``, ``bootstrap``"""
    created: float = 0.0
    history: dict[str, int] = field(default_factory=dict)
    """epoch (as a string) -> its partition count, for every epoch a switch made or began (what
    ``localstate reset --old-epochs`` removes)"""
    moved_inputs: dict[str, str] = field(default_factory=dict)
    """input -> where it was read before a rescale: a run refuses an input still read there (its
    records were laid out for the old partition count; see docs/state-as-data.md)"""

    def to_json(self) -> bytes:
        return json.dumps({"format": 1, **asdict(self)}, sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes, where: str) -> "EpochPointer":
        try:
            raw = json.loads(data)
            if not isinstance(raw, dict) or raw.get("format") != 1:
                raise ValueError(f"unknown format {raw.get('format') if isinstance(raw, dict) else raw!r:.40}")
            pointer = cls(**{name: raw[name] for name in cls.__dataclass_fields__ if name in raw})
            if type(pointer.epoch) is not int or pointer.epoch < 0 or type(pointer.reserved) is not int \
                    or pointer.reserved < pointer.epoch or not isinstance(pointer.moved_inputs, dict) or not isinstance(pointer.history, dict) \
                    or not (pointer.partitions is None or type(pointer.partitions) is int):
                raise ValueError("fields out of range")
            return pointer
        except (ValueError, TypeError) as exc:
            raise CheckpointError(f"the epoch pointer {where} is corrupt: {exc}", path=where,
                                  hint="restore it from a backup: it names the epoch (epochs/<e>) that holds the "
                                       "job's state; `localstate reset` starts the job over") from exc


_STREAM_EPOCH = re.compile(r"^(.*)\.e(\d+)$")


def epoch_stream(stream: str, epoch: int) -> str:
    """The name of changelog stream ``stream`` (its epoch-0 name) in epoch ``epoch``."""
    return stream if epoch == 0 else f"{stream}.e{int(epoch)}"


def with_epoch(job: JobConfig, epoch: int) -> JobConfig:
    """``job`` bound to epoch ``epoch``: its changelog streams renamed for the epoch, its checkpoints
    and local stores in the epoch's directories."""
    if epoch == job.epoch:
        return job
    stores = {}
    for name, store in job.stores.items():
        stream = store.changelog
        if stream is not None and job.epoch:
            stream = stream[:-len(f".e{job.epoch}")]
        stores[name] = replace(store, changelog=None if stream is None else epoch_stream(stream, epoch))
    return replace(job, epoch=int(epoch), stores=stores)


def _pointer_place(job: JobConfig) -> tuple[Any, str]:
    """``(system, where)``: the system keeping the pointer as a job object (None: a local file), and
    where it is, for messages."""
    if issubclass(job.registry.changelog_system(job.changelog_system), DurableCheckpoints):
        system = open_changelog_system(job)
        if isinstance(system, EpochCheckpoints):
            return system, f"{job.changelog_system}:jobs/{job.name}/{EPOCH_OBJECT}"
        system.close()
        return None, ""
    return None, str(safe_join(job.state_dir, job.name, EPOCH_OBJECT))


def read_epoch(job: JobConfig) -> EpochPointer:
    """The job's epoch pointer (epoch 0 when there is none, or when the job's folder is no folder of
    its own: a file, or a symlink that is never followed; whatever then writes there refuses)."""
    try:
        system, where = _pointer_place(job)
    except (NotADirectoryError, UnsafePathError):
        log.warning("job %r: no epoch pointer read (its state folder is a file or a symlink)", job.name)
        return EpochPointer()
    if system is None and not where:
        return EpochPointer()  # durable checkpoints without epochs: always epoch 0
    try:
        if system is not None:
            data = system.read_job_object(job.name, EPOCH_OBJECT)
        else:
            try:
                data = read_nofollow(Path(where))
            except (FileNotFoundError, NotADirectoryError):  # a file where a folder is: no pointer under it
                data = None
            except OSError as exc:
                raise CheckpointIOError(f"cannot read the epoch pointer {where}: {exc}", path=where,
                                        hint="check the file's permissions and disk") from exc
    finally:
        if system is not None:
            system.close()
    return EpochPointer() if data is None else EpochPointer.from_json(data, where)


def write_epoch(job: JobConfig, pointer: EpochPointer) -> None:
    """Replace the job's epoch pointer atomically (a temporary file, fsync, rename; or one PUT)."""
    system, where = _pointer_place(job)
    if system is None and not where:
        raise _no_epochs(job)
    try:
        if system is not None:
            system.write_job_object(job.name, EPOCH_OBJECT, pointer.to_json())
        else:
            job_directory(job)
            write_atomic(Path(where), pointer.to_json(), error=CheckpointIOError)
    finally:
        if system is not None:
            system.close()


def resolve_epoch(job: JobConfig) -> JobConfig:
    """``job`` bound to its current epoch (what every run and tool does first). Refuses a job file
    whose ``partitions`` is not the current epoch's partition count (PartitionCountError), and a
    config already bound to another epoch (FencedError: its state moved)."""
    current = read_epoch(job)
    if job.epoch not in (0, current.epoch):
        raise _moved(job, current)
    if current.partitions is not None and current.partitions != job.partitions:
        raise PartitionCountError(
            f"job {job.name!r} has partitions = {job.partitions}, but its state (epoch {current.epoch}, made by "
            f"{current.source or 'a rescale'}) has {current.partitions} partitions", job_partitions=job.partitions,
            state_partitions=current.partitions, source=job.source,
            hint=f"set partitions = {current.partitions} in the job file, the count of its state (to move the state "
                 f"to {job.partitions} partitions, rescale it after that: `localstate rescale JOB --partitions "
                 f"{job.partitions}`; docs/state-as-data.md)")
    return with_epoch(job, current.epoch)


def check_moved_inputs(job: JobConfig, inputs: Any) -> None:
    """InputError if an input (``inputs``: name -> opened input) is still read where it was before
    the rescale that made the current epoch: its records were laid out for the old partition count,
    and the new state starts every input at 0 (docs/state-as-data.md, the rescale procedure)."""
    moved = read_epoch(job).moved_inputs if job.epoch else {}
    for name, source in sorted(inputs.items()):
        place = source.location()
        if name in moved and place is not None and f"{place[0]}:{place[1]}" == moved[name]:
            raise InputError(f"input {name!r} still reads {place[1]}, the layout of the partition count the job had "
                             f"before its rescale; the rescaled state (epoch {job.epoch}, {job.partitions} partitions) "
                             "reads every input from the start of a new layout", input=name, place=place[1],
                             hint=f"point inputs.{name} at the records laid out for {job.partitions} partitions (a new "
                                  "directory, or a new Kafka topic with that many partitions); see "
                                  "docs/state-as-data.md")


def _moved(job: JobConfig, current: EpochPointer) -> FencedError:
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(current.created)) if current.created else "?"
    return FencedError(f"job {job.name!r}: this run reads state epoch {job.epoch}, but the job's state is now epoch "
                       f"{current.epoch} ({current.source or 'moved'} at {when})", epoch=job.epoch,
                       current=current.epoch, hint="stop this run and start the job again: it then reads the "
                                                   "current epoch")


def _no_epochs(job: JobConfig) -> LocalStateError:
    return LocalStateError(f"changelog system {job.changelog_system!r} keeps checkpoints in durable storage but "
                           "offers no state epochs (EpochCheckpoints): its jobs cannot be rescaled or started "
                           "from a savepoint", hint="use a changelog system with epochs (file, kafka, objectstore)")


#: What an operator does when a partition's checkpoint is missing but its changelog holds records.
MISSING_CHECKPOINT_HINT = ("restore the checkpoint (from a backup, or from the bucket's object versioning), or run "
                           "`localstate reset` to discard this job's state and start over from its inputs")


def check_no_history(changelog: ChangelogPartition, *, store: str, partition: int, checkpoint_where: str,
                     entry_only: bool = False) -> None:
    """Raise CheckpointError if ``changelog`` holds records although task ``partition`` has no
    checkpoint (at ``checkpoint_where``), or (``entry_only``) has one that names no offset for
    ``store``: the checkpoint, or that part of it, is missing, and starting the store empty would
    drop committed state (recovery would trim every record, and a later commit overwrite them). A
    file changelog shows it by its end offset; a :class:`ListedHistory` changelog (objects named by
    manifests) is listed once."""
    if entry_only:
        # Every checkpoint names every logged store from the partition's first open on, so only a
        # damaged checkpoint, or a store removed from the job and added back, lacks one with records.
        missing = (f"the checkpoint of partition {partition} at {checkpoint_where} names no changelog offset for "
                   f"store {store!r}, but its changelog")
        what = "that part of the checkpoint is missing (damaged, or a store of this name was removed and added back)"
    else:
        missing = f"no checkpoint for partition {partition} at {checkpoint_where}, but the changelog of store {store!r}"
        what = "the checkpoint is missing"
    end = changelog.end_offset()
    if end > 0:
        raise CheckpointError(f"{missing} holds {end} record(s): {what}", store=store, partition=partition,
                              path=checkpoint_where, hint=MISSING_CHECKPOINT_HINT)
    if isinstance(changelog, ListedHistory):
        found = changelog.stored_history()
        if found is not None:
            raise CheckpointError(
                f"{missing} holds {found.objects} object(s) ({found.size} bytes, records up to offset {found.end}) "
                f"at {found.where}: {what}", store=store, stream=found.stream, partition=partition,
                path=found.where, checkpoint=checkpoint_where, objects=found.objects, hint=MISSING_CHECKPOINT_HINT)


def checkpoint_where(checkpoints: Any, partition: int) -> str:
    """Where ``checkpoints`` keeps ``partition``'s checkpoint, for messages: its URL in durable
    storage, else its file."""
    if isinstance(checkpoints, CheckpointStore) and checkpoints.objects is not None:
        return f"{checkpoints.objects.describe()}/{int(partition)}"
    return str(checkpoints.path(partition))


def state_places(job: JobConfig) -> list[tuple[str, tuple[str, str]]]:
    """What an output must never write into: the job's state directory and its stores' changelogs
    (where the changelog system says they live, see ``StreamLocations``)."""
    places = [("the job's state directory", ("path", str(job.state_dir / job.name)))]
    streams = sorted({store.changelog for store in job.stores.values() if store.changelog})
    if not streams:
        return places
    try:
        system = open_changelog_system(job)
    except LocalStateError:
        return places  # an unusable changelog system is reported by its own validation
    try:
        if isinstance(system, StreamLocations):
            places += [(f"changelog {s!r}", system.stream_location(s)) for s in streams]
    finally:
        system.close()
    return places
