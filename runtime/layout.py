"""Where a job's state lives: its directory, its checkpoints, its local stores, and its changelog
system, all derived from the job config (every runtime and tool finds them here, never by path
arithmetic of its own), and the check that refuses to start a store empty while its changelog still
holds committed records.

Guarantee: every path returned stays inside the state directory (or ``local_dir``) of the job;
:func:`job_directory` creates the job's directory with localstate's ownership marker, which ``reset``
checks before it deletes anything.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from localstate.core.changelog import ChangelogPartition, ChangelogSystem, DurableCheckpoints, ListedHistory, \
    StreamLocations
from localstate.core.checkpoint import CheckpointStore
from localstate.core.config import JobConfig
from localstate.core.fsutil import make_owned_dir
from localstate.core.names import safe_join
from localstate.errors import CheckpointError, LocalStateError

__all__ = ["open_changelog_system", "store_root", "store_directory", "job_directory", "checkpoint_store",
           "check_no_history", "checkpoint_where", "MISSING_CHECKPOINT_HINT", "state_places"]


def open_changelog_system(job: JobConfig, name: str | None = None) -> ChangelogSystem:
    """Instantiate the job's changelog system (or ``name``) with its validated options."""
    name = name or job.changelog_system
    system_class = job.registry.changelog_system(name)
    return system_class(job.changelog_options.get(name, {}), job.state_dir)


def store_root(job: JobConfig) -> Path:
    """Where the job's local stores live on this host when nothing else is said: ``job.local_dir``
    (environment variables expanded here, on this host) if set, else the state directory."""
    if job.local_dir is None:
        return job.state_dir
    return Path(os.path.abspath(os.path.expandvars(job.local_dir)))


def store_directory(job: JobConfig, store: str, partition: int, root: Path | None = None) -> Path:
    """``<root>/<job>/stores/<store>/<partition>`` (``root``: :func:`store_root` unless given),
    checked to stay inside ``root``."""
    return safe_join(store_root(job) if root is None else root, job.name, "stores", store, str(partition))


def job_directory(job: JobConfig) -> Path:
    """``<state_dir>/<job>``, created with localstate's ownership marker (what ``reset`` checks
    before deleting it); refuses symlinks (UnsafePathError)."""
    return make_owned_dir(job.state_dir, safe_join(job.state_dir, job.name), "job", job=job.name,
                          layout=lambda entry: entry in ("checkpoints", "stores"))


def checkpoint_store(job: JobConfig) -> CheckpointStore:
    """The job's checkpoints: in durable storage when its changelog system keeps them there
    (:class:`DurableCheckpoints`), else in ``<state_dir>/<job>/checkpoints``. Instance locks are
    always local files in that directory."""
    job_directory(job)
    objects = None
    if issubclass(job.registry.changelog_system(job.changelog_system), DurableCheckpoints):
        objects = open_changelog_system(job).checkpoint_objects(job.name)  # type: ignore[attr-defined]
    return CheckpointStore(safe_join(job.state_dir, job.name, "checkpoints"), anchor=job.state_dir, objects=objects)


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
