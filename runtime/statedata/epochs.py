"""What one epoch of a job's state consists of, to remove the old ones (``localstate reset
--old-epochs``) or all of them (``localstate reset``): its checkpoints (local, or the changelog
system's durable ones), its local stores on this host, and its changelog streams. Only what
localstate made: local directories carrying its ownership marker, streams named by the epoch."""

from __future__ import annotations

import logging
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from localstate.core.changelog import DeletableStreams, DurableCheckpoints, LocalStreams
from localstate.core.config import JobConfig
from localstate.core.fsutil import is_owned
from localstate.core.names import safe_join
from localstate.runtime.layout import (epoch_checkpoint_objects, epoch_parts, open_changelog_system, read_epoch,
                                       store_root, with_epoch)

__all__ = ["EpochPlaces", "epoch_places", "old_epoch_places"]

log = logging.getLogger(__name__)

_EPOCH_ZERO_ENTRIES = ("checkpoints", "stores", "attempts", "dataframe-outputs")
"""What epoch 0 keeps directly in the job's directory (beside the pointer, progress and later epochs)."""


@dataclass
class EpochPlaces:
    """The places of some epochs of a job's state."""

    job: JobConfig
    directories: list[Path] = field(default_factory=list)
    local_streams: list[Path] = field(default_factory=list)
    remote_streams: list[str] = field(default_factory=list)
    checkpoints: list[tuple[Any, int]] = field(default_factory=list)
    """(durable checkpoint objects, partitions) per epoch"""

    def any(self) -> bool:
        return bool(self.directories or self.local_streams or self.remote_streams or self.checkpoints)

    def describe(self) -> list[str]:
        return ([str(path) for path in self.directories + self.local_streams]
                + [f"changelog {stream!r} on {self.job.changelog_system}" for stream in self.remote_streams]
                + [f"the checkpoints in {objects.describe()}" for objects, _ in self.checkpoints])

    def delete(self) -> None:
        """Checkpoints first (an epoch without them is never taken for current), then the rest."""
        for objects, partitions in self.checkpoints:
            for partition in range(partitions):
                objects.delete_partition(partition)
        for path in self.directories + self.local_streams:
            shutil.rmtree(path, ignore_errors=True)  # rmtree removes symlinks inside, never what they point to
        if self.remote_streams:
            system = open_changelog_system(self.job)
            try:
                for stream in self.remote_streams:
                    system.delete_stream(stream)  # type: ignore[attr-defined]
            finally:
                system.close()


def epoch_places(job: JobConfig, epochs: Iterable[int]) -> EpochPlaces:
    """The places of ``epochs`` of ``job``'s state that exist (see the module docstring)."""
    base = with_epoch(job, 0)
    pointer = read_epoch(job)
    places = EpochPlaces(job)
    roots = {job.state_dir, store_root(job)}
    system = open_changelog_system(job) if any(s.changelog for s in base.stores.values()) or \
        issubclass(job.registry.changelog_system(job.changelog_system), DurableCheckpoints) else None
    try:
        for epoch in epochs:
            at = with_epoch(base, epoch)
            for root in sorted(roots):
                home = safe_join(root, job.name)
                if epoch:
                    places.directories += [p for p in [safe_join(home, *epoch_parts(epoch))] if p.is_dir()]
                elif is_owned(home, "job", job=job.name) or root != job.state_dir:
                    places.directories += [home / name for name in _EPOCH_ZERO_ENTRIES if (home / name).is_dir()]
            if system is None:
                continue
            streams = sorted({s.changelog for s in at.stores.values() if s.changelog})
            if isinstance(system, LocalStreams):
                places.local_streams += [system.stream_dir(s) for s in streams
                                         if is_owned(system.stream_dir(s), "changelog-stream", stream=s)]
            elif isinstance(system, DeletableStreams):
                places.remote_streams += streams
            if isinstance(system, DurableCheckpoints):
                objects = epoch_checkpoint_objects(at, system)
                partitions = pointer.history.get(str(epoch), job.partitions)
                if any(objects.latest(p) is not None for p in range(partitions)):
                    places.checkpoints.append((objects, partitions))
    finally:
        if system is not None:
            system.close()
    return places


def old_epoch_places(job: JobConfig) -> EpochPlaces:
    """The places of every epoch of ``job``'s state but the current one (``reset --old-epochs``),
    those of epochs a switch left unfinished included."""
    current = read_epoch(job)
    return epoch_places(job, [epoch for epoch in range(current.reserved + 1) if epoch != current.epoch])
