"""The ``objectstore`` changelog system: changelogs and checkpoints as immutable objects on shared
storage (a shared directory, S3-compatible storage, HDFS, any fsspec file system), with no shared
appends and no locks. See docs/durable.md.

Keys below the configured ``url``::

    changelogs/<stream>/...                          see :mod:`.chain`
    jobs/<job>/checkpoints/<p>/<seq:020d>-<token>.json   one per saved checkpoint, latest wins
    jobs/<job>/epochs/<e>/checkpoints/<p>/...         the same, for the job's state epoch e > 0
    jobs/<job>/<name>                                 small job objects (the epoch pointer ``epoch.json``)
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Callable, ClassVar, Iterable, Mapping

from localstate.core.changelog import ChangelogSystem, CompactionStats
from localstate.core.checkpoint import CheckpointObjects
from localstate.core.names import check_name
from localstate.core.options import Option, parse_duration, parse_path
from localstate.errors import ChangelogError, CheckpointError, ConfigError, LocalStateError

from .chain import Chain, parse_name, partition_prefix, stream_prefix
from .partition import COMPACTORS, ObjectStoreChangelogPartition
from .storage import ObjectInfo, ObjectStore, open_object_store

__all__ = ["ObjectStoreChangelogSystem", "ObjectCheckpoints", "GarbageRounds", "STREAM_META"]

log = logging.getLogger(__name__)

STREAM_META = "stream.json"
_CHECKPOINT_RE = re.compile(r"^(\d{20})-([0-9a-f]{32})\.json$")


def _url(value: str) -> str:
    if "://" not in value:
        parse_path(value)
    return value


class ObjectStoreChangelogSystem(ChangelogSystem):
    """Durable changelogs and checkpoints on shared storage, written as immutable objects."""

    description = "immutable delta/snapshot objects on a shared directory, S3 or HDFS; checkpoints there too"
    options: ClassVar[Mapping[str, Option]] = {
        "url": Option(str, parse=_url, doc="where: a directory (shared by every host), file:///dir, "
                                           "s3://bucket/prefix, hdfs://namenode:port/dir, or any fsspec URL"),
        "endpoint": Option(str, default="", doc="S3 endpoint, e.g. 'http://seaweedfs:8333' (default: AWS)"),
        "region": Option(str, default="", doc="S3 region (default: us-east-1)"),
        "access_key": Option(str, default="", doc="S3 access key (default: AWS_ACCESS_KEY_ID and friends)"),
        "secret_key": Option(str, default="", doc="S3 secret key (default: AWS_SECRET_ACCESS_KEY and friends)"),
        "snapshot_every": Option(int, default=10, minimum=1,
                                 doc="flushes (commits) between compacted snapshots of a partition"),
        "compactor": Option(str, default="process", choices=COMPACTORS,
                            doc="where snapshots are built: 'process' (a compactor subprocess per writer, off the "
                                "task's GIL) or 'thread' (a thread of the task's process)"),
        "snapshot_min_records": Option(int, default=0, minimum=0,
                                       doc="skip a snapshot while the deltas since the last hold fewer records"),
        "gc_keep": Option(int, default=3, minimum=1,
                          doc="garbage collection keeps every object named by the last N checkpoints"),
        "gc_grace": Option((int, float, str), default=600.0, parse=parse_duration,
                           doc="...and every object younger than this ('10m'): in-flight writes; must exceed the "
                               "longest time from a flush to its checkpoint (a batch)"),
        "compact_interval": Option((int, float, str), default=600.0, parse=parse_duration,
                                   doc="period of garbage collection while a job runs ('10m'); 0 disables it"),
    }

    def __init__(self, options: Mapping[str, Any] | None = None, state_dir: Path | str = ".") -> None:
        validated = self.validate(dict(options or {}), "changelogs.objectstore")
        super().__init__(validated, Path(state_dir))
        self.store: ObjectStore = open_object_store(validated, self.state_dir)
        self.snapshot_every: int = validated["snapshot_every"]
        self.snapshot_min_records: int = validated["snapshot_min_records"]
        self.compactor: str = validated["compactor"]
        self.gc_keep: int = validated["gc_keep"]
        self.gc_grace: float = validated["gc_grace"]
        self.compact_interval: float = validated["compact_interval"]

    # ---------------------------------------------------------------- streams

    def _check(self, stream: str, partition: int | None = None) -> None:
        check_name(stream, "stream", "changelog.stream")
        if partition is not None and (isinstance(partition, bool) or not isinstance(partition, int) or partition < 0):
            raise ChangelogError(f"invalid partition {partition!r}", stream=stream, hint="partitions are integers >= 0")

    def _meta(self, stream: str) -> dict[str, Any] | None:
        key = f"{stream_prefix(stream)}/{STREAM_META}"
        try:
            meta = json.loads(self.store.get(key))
        except FileNotFoundError:
            return None
        except ValueError as exc:
            raise ChangelogError(f"unreadable stream metadata {self.store.where(key)}: {exc}", stream=stream,
                                 path=self.store.where(key), hint="it must be JSON like {\"format\": 1, \"partitions\": 4}") from exc
        if not isinstance(meta, dict) or type(meta.get("partitions")) is not int:
            raise ChangelogError(f"malformed stream metadata {self.store.where(key)}", stream=stream,
                                 path=self.store.where(key), hint='it must be JSON like {"format": 1, "partitions": 4}')
        return meta

    def ensure_stream(self, stream: str, partitions: int) -> None:
        self._check(stream)
        if isinstance(partitions, bool) or not isinstance(partitions, int) or partitions < 1:
            raise ConfigError.at("changelog.partitions", f"must be an integer >= 1, got {partitions!r}")
        meta = self._meta(stream)
        if meta is None:
            self.store.put(f"{stream_prefix(stream)}/{STREAM_META}",
                           json.dumps({"format": 1, "partitions": partitions}).encode())
        elif meta["partitions"] != partitions:
            raise ChangelogError(
                f"changelog stream has {meta['partitions']} partitions but the job uses {partitions}", stream=stream,
                path=self.store.where(stream_prefix(stream)),
                hint="the partition count of a job cannot change (state is partitioned by it): restore the previous "
                     "count, or start with a new job name / another url")

    def partition(self, stream: str, partition: int) -> ObjectStoreChangelogPartition:
        """Open one partition. Its chain is empty until :meth:`~ObjectStoreChangelogPartition.adopt`
        sets it from the checkpoint's manifest (the runtime does so at once)."""
        self._check(stream, partition)
        meta = self._meta(stream)
        if meta is not None and partition >= meta["partitions"]:
            raise ChangelogError(f"partition {partition} does not exist: the stream has {meta['partitions']}",
                                 stream=stream, partition=partition,
                                 hint="use a partition number below the stream's partition count")
        return ObjectStoreChangelogPartition(self.store, stream, partition, snapshot_every=self.snapshot_every,
                                             snapshot_min_records=self.snapshot_min_records, gc_grace=self.gc_grace,
                                             compactor=self.compactor)

    def reader(self, stream: str, partition: int) -> ObjectStoreChangelogPartition:
        """A read-only partition (``localstate inspect``, the state reader): adopt a manifest, then read."""
        self._check(stream, partition)
        return ObjectStoreChangelogPartition(self.store, stream, partition, writable=False)

    def manifest_objects(self, manifest: Mapping[str, Any]) -> list[tuple[str, int]]:
        """``(url, bytes)`` of the snapshot and deltas ``manifest`` names, oldest first."""
        chain = Chain.from_manifest(manifest, manifest.get("stream"), manifest.get("partition"))
        prefix = partition_prefix(chain.stream, chain.partition)
        return [(self.store.where(f"{prefix}/{item.name}"), item.size) for item in chain.objects()]

    def stream_location(self, stream: str) -> tuple[str, str]:
        """``("path", dir)`` on a local/shared directory (outputs must never write there), else
        ``("url", url)``."""
        self._check(stream)
        if self.store.local_root is not None:
            return "path", str(self.store.local_root / stream_prefix(stream))
        return "url", self.store.where(stream_prefix(stream))

    def delete_stream(self, stream: str) -> bool:
        """Delete every object of ``stream`` that localstate's naming scheme produced (``reset``)."""
        self._check(stream)
        found = False
        prefix = stream_prefix(stream)
        for info in self.store.list(prefix):
            rest = info.key[len(prefix) + 1:]
            if rest == STREAM_META or _owned_partition_object(rest):
                self.store.delete(info.key)
                found = True
        return found

    def objects(self, stream: str, partition: int) -> list[ObjectInfo]:
        """Every object of the partition localstate's naming scheme produced, committed or not."""
        self._check(stream, partition)
        prefix = partition_prefix(stream, partition)
        return [info for info in self.store.list(prefix) if parse_name(info.key[len(prefix) + 1:]) is not None]

    def checkpoint_objects(self, job: str) -> "ObjectCheckpoints":
        check_name(job, "job", "job.name")
        return ObjectCheckpoints(self.store, f"jobs/{job}/checkpoints", keep=self.gc_keep + 1)

    def epoch_checkpoint_objects(self, job: str, epoch: int) -> "ObjectCheckpoints":
        """The checkpoints of ``job``'s state epoch ``epoch`` (``core.changelog.EpochCheckpoints``)."""
        check_name(job, "job", "job.name")
        if epoch == 0:
            return self.checkpoint_objects(job)
        return ObjectCheckpoints(self.store, f"jobs/{job}/epochs/{int(epoch)}/checkpoints", keep=self.gc_keep + 1)

    def _job_key(self, job: str, name: str) -> str:
        check_name(job, "job", "job.name")
        check_name(name, "object", "name")
        return f"jobs/{job}/{name}"

    def read_job_object(self, job: str, name: str) -> bytes | None:
        try:
            return self.store.get(self._job_key(job, name))
        except FileNotFoundError:
            return None

    def write_job_object(self, job: str, name: str, data: bytes) -> None:
        """A PUT (on a directory: a temporary file, fsync, rename): a reader sees the old or the new."""
        self.store.put(self._job_key(job, name), data)

    def delete_job_object(self, job: str, name: str) -> None:
        self.store.delete(self._job_key(job, name))

    # ---------------------------------------------------------------- garbage collection

    def referenced(self, stream: str) -> dict[int, set[str]]:
        """Object names of ``stream`` named by the last ``gc_keep`` checkpoints of every job here, by
        partition; a partition those checkpoints mention with an empty chain maps to an empty set."""
        out: dict[int, set[str]] = {}
        by_partition: dict[str, list[ObjectInfo]] = {}
        for info in self.store.list("jobs"):
            parts = info.key.split("/")
            # jobs/<job>/checkpoints/<p>/<name> and jobs/<job>/epochs/<e>/checkpoints/<p>/<name>
            if len(parts) in (5, 7) and parts[-3] == "checkpoints" and _CHECKPOINT_RE.match(parts[-1]) \
                    and (len(parts) == 5 or parts[2] == "epochs"):
                by_partition.setdefault("/".join(parts[:-1]), []).append(info)
        for infos in by_partition.values():
            for info in sorted(infos, key=lambda i: i.key)[-self.gc_keep:]:
                try:
                    data = json.loads(self.store.get(info.key))
                except FileNotFoundError:
                    continue  # removed by the driver's own checkpoint GC meanwhile
                except ValueError as exc:
                    raise CheckpointError(f"checkpoint {self.store.where(info.key)} is not JSON: {exc}",
                                          path=self.store.where(info.key),
                                          hint="garbage collection stops until the checkpoint is readable") from exc
                for manifest in (data.get("manifests") or {}).values():
                    if isinstance(manifest, dict) and manifest.get("stream") == stream:
                        chain = Chain.from_manifest(manifest, stream, manifest.get("partition"))
                        out.setdefault(chain.partition, set()).update(item.name for item in chain.objects())
        return out

    def collect_garbage(self, stream: str, partitions: Iterable[int] | None = None,
                        now: float | None = None) -> CompactionStats:
        """Delete the objects of ``stream`` (of ``partitions``; default all) that no checkpoint among the
        last ``gc_keep`` of any job names and that are older than ``gc_grace``: superseded deltas and
        snapshots, and the orphans of crashed or zombie attempts. Only names localstate produces.

        A partition that no checkpoint mentions at all (no manifest of the stream partition in any
        job's last ``gc_keep`` checkpoints) is left alone: its checkpoints are lost, and its objects are
        the evidence the runtime refuses to start over (docs/durable.md, "A lost checkpoint") and what
        restoring the checkpoint needs; ``localstate reset`` deletes them."""
        started = time.perf_counter()
        now = time.time() if now is None else now
        stats = CompactionStats()
        referenced = self.referenced(stream)
        prefix = stream_prefix(stream)
        wanted = None if partitions is None else set(partitions)
        unmentioned: dict[int, int] = {}  # partition no checkpoint mentions -> objects kept
        for info in self.store.list(prefix):
            parts = info.key[len(prefix) + 1:].split("/", 1)
            if len(parts) != 2 or not parts[0].isdigit() or parse_name(parts[1]) is None:
                continue
            partition = int(parts[0])
            if wanted is not None and partition not in wanted:
                continue
            stats.bytes_before += info.size
            named = referenced.get(partition)
            if named is None:
                unmentioned[partition] = unmentioned.get(partition, 0) + 1
            # An object of unknown age may be a live attempt's fresh write: never deleted.
            if (named is None or parts[1] in named or info.mtime is None
                    or now - info.mtime < self.gc_grace):
                stats.bytes_after += info.size
                continue
            self.store.delete(info.key)
            stats.segments_deleted += 1
        for partition, count in sorted(unmentioned.items()):
            log.warning("changelog %r partition %d: %d object(s) at %s kept: no checkpoint mentions the partition "
                        "(a lost checkpoint, or a job that has not committed yet); restore the checkpoint or run "
                        "`localstate reset`", stream, partition, count,
                        self.store.where(partition_prefix(stream, partition)))
        stats.seconds = time.perf_counter() - started
        return stats

    def compact_stream(self, stream: str, upto_by_partition: Mapping[int, int]) -> CompactionStats:
        """``localstate compact``: snapshots are taken by the writers; what is left to do on demand
        is garbage collection of the listed partitions."""
        return self.collect_garbage(stream, upto_by_partition)

    def compaction_rounds(self, targets: Callable[[], Mapping[tuple[str, int], int]]) -> "GarbageRounds":
        return GarbageRounds(self, targets)


def _owned_partition_object(rest: str) -> bool:
    parts = rest.split("/", 1)
    return len(parts) == 2 and parts[0].isdigit() and parse_name(parts[1]) is not None


class GarbageRounds:
    """Rounds of garbage collection over ``targets()`` (the driver runs one after saving checkpoints)."""

    def __init__(self, system: ObjectStoreChangelogSystem, targets: Callable[[], Mapping[tuple[str, int], int]]) -> None:
        self.system = system
        self.targets = targets
        self.runs = 0
        self.errors: list[LocalStateError] = []

    def run_once(self) -> CompactionStats:
        total = CompactionStats()
        self.runs += 1
        by_stream: dict[str, list[int]] = {}
        try:
            for stream, partition in self.targets():
                by_stream.setdefault(stream, []).append(partition)
            for stream, partitions in by_stream.items():
                total.add(self.system.collect_garbage(stream, partitions))
        except LocalStateError as exc:
            log.warning("objectstore garbage collection failed: %s", exc)
            self.errors.append(exc)
        return total


class ObjectCheckpoints(CheckpointObjects):
    """Checkpoints as immutable objects ``<prefix>/<p>/<seq:020d>-<token>.json`` (``prefix``:
    ``jobs/<job>/checkpoints``, or ``jobs/<job>/epochs/<e>/checkpoints``): each
    save writes the next sequence number, the highest wins, the ``keep`` newest are kept.

    A save (the runtime's: the generation check's :meth:`latest`, then :meth:`put`) costs three
    requests — a listing, the PUT, the delete of the oldest — not five: :meth:`latest` does not read
    back an object this instance wrote itself (objects are immutable and their names unique, so the
    bytes it put are the bytes stored), and :meth:`put` numbers the new object from the listing
    :meth:`latest` or the previous :meth:`put` of the partition left (a listing is taken when there
    is none). That listing is at most one save old; a concurrent writer in between is what the
    generation check (a read, then a write: see docs/durable.md, Limits) already does not exclude."""

    def __init__(self, store: ObjectStore, prefix: str, keep: int) -> None:
        self.store = store
        self.prefix = prefix
        self.keep = keep
        self._lock = threading.RLock()
        self._listed: dict[int, list[tuple[int, str]]] = {}  # partition -> the last listing (+ own puts)
        self._written: dict[int, tuple[str, bytes]] = {}  # partition -> (key, bytes) of this instance's last put

    def _list(self, partition: int) -> list[tuple[int, str]]:
        prefix = f"{self.prefix}/{int(partition)}"
        out = []
        for info in self.store.list(prefix):
            match = _CHECKPOINT_RE.match(info.key[len(prefix) + 1:])
            if match:
                out.append((int(match.group(1)), info.key))
        out.sort()
        with self._lock:
            self._listed[partition] = list(out)
        return out

    def latest(self, partition: int) -> tuple[str, bytes] | None:
        listing = self._list(partition)
        written = self._written.get(partition)
        for _seq, key in reversed(listing):
            if written is not None and written[0] == key:
                return self.store.where(key), written[1]
            try:
                return self.store.where(key), self.store.get(key)
            except FileNotFoundError:
                continue  # deleted by a concurrent GC after the listing: an older one is no answer either
        return None

    def put(self, partition: int, data: bytes) -> str:
        with self._lock:  # one put at a time: two saves of this instance never draw the same number
            existing = self._listed.pop(partition, None)
            if existing is None:
                existing = self._list(partition)
            seq = existing[-1][0] + 1 if existing else 0
            key = f"{self.prefix}/{int(partition)}/{seq:020d}-{uuid.uuid4().hex}.json"
            self.store.put(key, data)
            stale = existing[:max(0, len(existing) + 1 - self.keep)]
            for _old, old_key in stale:
                self.store.delete(old_key)
            self._written[partition] = (key, bytes(data))
            self._listed[partition] = existing[len(stale):] + [(seq, key)]
            return self.store.where(key)

    def delete_partition(self, partition: int) -> None:
        for _seq, key in self._list(partition):
            self.store.delete(key)

    def describe(self) -> str:
        return self.store.where(self.prefix)
