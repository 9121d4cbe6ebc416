"""Checkpoints: the commit point of one task partition.

A checkpoint records, consistently with each other, the next input offset of every input stream
partition, the changelog end offset of every logged store, the output positions, and a generation
number that fences stale instances. It is written atomically (temp file, fsync, rename, fsync dir),
so a reader sees either the previous or the new checkpoint, never a mix.

Where checkpoints live: by default ``<state_dir>/<job>/checkpoints/<partition>.json`` on the driver's
file system. A changelog system offering durable checkpoints (the ``objectstore`` system) keeps them as
immutable objects in shared storage instead (:class:`CheckpointObjects`, latest wins), so a driver
restarted on another host continues; instance locks stay in the local directory either way.
"""

from __future__ import annotations

import fcntl
import json
import math
import os
from abc import ABC, abstractmethod
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from localstate.core.commit_stats import CommitStats
from localstate.core.fsutil import ensure_dir, open_nofollow, os_error, read_nofollow, write_atomic
from localstate.core.names import safe_join
from localstate.errors import CheckpointError, CheckpointIOError, FencedError

__all__ = ["Checkpoint", "CheckpointStore", "CheckpointObjects"]

_FORMAT = 1
RETIRED = "RETIRED"
"""The file marking a checkpoint directory whose state was replaced (:meth:`CheckpointStore.retire`)."""
_LIMIT = 1 << 63  # offsets are 64-bit in every changelog and stream


@dataclass(frozen=True)
class Checkpoint:
    """What a task partition has committed."""

    partition: int
    generation: int = 0
    inputs: dict[str, int] = field(default_factory=dict)
    """input stream -> next offset to process"""
    changelogs: dict[str, int] = field(default_factory=dict)
    """store -> changelog end offset"""
    outputs: dict[str, int] = field(default_factory=dict)
    """output stream -> end offset after this commit's outputs"""
    batch: int | None = None
    """the id of the last Spark micro-batch this partition applied through the DataFrame entry point
    (:mod:`localstate.runtime.spark.dataframe`), None if none: a re-executed batch is recognised by it"""
    attempt: str | None = None
    """cluster mode: the id of the task attempt that prepared this checkpoint. A host reuses its local
    state only if the committed checkpoint names the attempt that last wrote it (same offsets from two
    attempts of one batch are not the same state)"""
    manifests: dict[str, dict[str, Any]] = field(default_factory=dict)
    """store -> the changelog partition's manifest (:class:`~localstate.core.changelog.ManifestedChangelog`):
    the objects that hold its committed records. Empty for systems without manifests."""
    watermark: float | None = None
    """the partition's event time (:mod:`localstate.core.time`) at this commit: a reopened partition's
    watermark starts here and never goes back; None before any timestamped record (and in checkpoints
    written before watermarks existed)"""
    next_timer: float | None = None
    """the earliest processing-time timer pending at this commit (seconds since the epoch), None if
    none: a standing driver runs a batch for the partition when it is due, even with no new input"""
    formats: dict[str, str] = field(default_factory=dict)
    """store -> the layout of its state (:class:`~localstate.core.engine.StateFormat`), for engines
    that name one: a store reopened with options that change it is refused"""
    input_ids: dict[str, str] = field(default_factory=dict)
    """input stream -> the identity of what this partition of it read up to this commit, for inputs that
    have one (:class:`~localstate.core.stream.IdentifiedInput`: a Kafka topic's id, a file
    partition's device, inode and first bytes): the position is not applied to another stream of the
    same name (a topic deleted and created again, a file replaced)"""
    home: str | None = None
    """cluster mode: the *home* of the attempt that prepared this checkpoint, an id of the executor
    host's local store directory: the next batch, or the next run after a restart, prefers an executor
    with this home, where the partition's local state is warm. A placement hint only, never trusted
    for correctness (the ``attempt`` markers decide whether local state is used); a damaged value
    reads as None (unknown)"""
    transactions: dict[str, dict[str, Any]] = field(default_factory=dict)
    """output -> the transaction this commit left open on it (transactional Kafka outputs: ``id``,
    ``producer_id``, ``epoch``), to be committed once this checkpoint is saved; a partition opened
    from this checkpoint commits them first (committing again is harmless)"""
    commit_stats: CommitStats | None = None
    """the partition's per-commit figures (:mod:`localstate.core.commit_stats`: commit durations,
    record latencies), for the driver's metrics; None if none (micro-batch jobs, checkpoints written
    before they existed). Never state: a damaged value reads as None, never a refused checkpoint"""

    def to_json(self) -> str:
        # A shallow copy (dumped right away; no field is a dataclass but commit_stats, written below):
        # asdict's deep copy took most of a save's CPU time.
        data = {f.name: getattr(self, f.name) for f in fields(self)}
        if data["batch"] is None:
            del data["batch"]  # checkpoints of jobs that never ran a DataFrame batch stay as they were
        for name in ("attempt", "home"):
            if data[name] is None:
                del data[name]  # only cluster-mode checkpoints name their attempt and its home
        if not data["manifests"]:
            del data["manifests"]  # nor do those of changelog systems without manifests
        for name in ("watermark", "next_timer"):
            if data[name] is None:
                del data[name]  # only jobs with timestamped input or timers have them
        for name in ("formats", "input_ids", "transactions"):
            if not data[name]:
                del data[name]  # only jobs whose stores or inputs name them have them
        if self.commit_stats is None:
            del data["commit_stats"]  # only partitions that commit by themselves have them
        else:
            data["commit_stats"] = self.commit_stats.to_json()
        return json.dumps({"format": _FORMAT, **data}, sort_keys=True)

    @classmethod
    def from_json(cls, text: str, where: str) -> "Checkpoint":
        """Parse and validate a checkpoint file's text; every field is type- and range-checked
        (CheckpointError naming ``where`` and the field otherwise)."""
        try:
            data = json.loads(text)
        except (ValueError, RecursionError) as exc:
            raise _corrupt(where, "", f"not JSON: {exc}") from exc
        if not isinstance(data, dict):
            raise _corrupt(where, "", f"expected a JSON object, got {type(data).__name__}")
        if data.get("format") != _FORMAT:
            raise _corrupt(where, "format", f"unknown checkpoint format {data.get('format')!r:.40}")
        for name in ("partition", "inputs", "changelogs"):
            if name not in data:
                raise _corrupt(where, name, "missing")
        return cls(partition=_offset(data["partition"], where, "partition"),
                   generation=_offset(data.get("generation", 0), where, "generation"),
                   inputs=_offsets(data["inputs"], where, "inputs"),
                   changelogs=_offsets(data["changelogs"], where, "changelogs"),
                   outputs=_offsets(data.get("outputs", {}), where, "outputs"),
                   batch=None if data.get("batch") is None else _offset(data["batch"], where, "batch"),
                   attempt=_attempt(data.get("attempt"), where),
                   manifests=_manifests(data.get("manifests", {}), where),
                   watermark=_time(data.get("watermark"), where, "watermark"),
                   next_timer=_time(data.get("next_timer"), where, "next_timer"),
                   formats=_names(data.get("formats", {}), where, "formats", "store -> format name"),
                   input_ids=_names(data.get("input_ids", {}), where, "input_ids", "input -> identity"),
                   home=_home(data.get("home")),
                   transactions=_transactions(data.get("transactions", {}), where),
                   commit_stats=CommitStats.parse(data.get("commit_stats")))


def _corrupt(where: str, field_name: str, problem: str) -> CheckpointError:
    label = f" field {field_name!r}" if field_name else ""
    return CheckpointError(f"checkpoint {where} is corrupt:{label} {problem}", path=where, field=field_name or None,
                           hint="restore the file from a backup, or reset the job with `localstate reset` "
                                "(state is then rebuilt from scratch)")


def _offset(value: Any, where: str, field_name: str) -> int:
    """A non-negative int (bool, float and str are refused: an offset of -5 would trim a store empty)."""
    if type(value) is not int:
        raise _corrupt(where, field_name, f"expected a non-negative integer, got {type(value).__name__} {value!r:.40}")
    if not 0 <= value < _LIMIT:
        raise _corrupt(where, field_name, f"must be in 0..2**63-1, got {value}")
    return value


def _offsets(value: Any, where: str, field_name: str) -> dict[str, int]:
    if not isinstance(value, dict):
        raise _corrupt(where, field_name, f"expected an object of name -> offset, got {type(value).__name__}")
    return {name: _offset(offset, where, f"{field_name}.{name}") for name, offset in value.items()}


def _names(value: Any, where: str, field_name: str, what: str) -> dict[str, str]:
    """A name -> short string map (at most 200 characters each)."""
    if not isinstance(value, dict) or not all(isinstance(v, str) and len(v) <= 200 for v in value.values()):
        raise _corrupt(where, field_name, f"expected an object of {what}")
    return dict(value)


def _time(value: Any, where: str, field_name: str) -> float | None:
    """None, or a finite number of seconds since the epoch."""
    if value is None:
        return None
    if type(value) not in (int, float) or not math.isfinite(value):
        raise _corrupt(where, field_name, f"expected a time in seconds (a finite number), got {value!r:.40}")
    return float(value)


def _attempt(value: Any, where: str) -> str | None:
    """None, or an attempt id: 1 to 64 lowercase hex digits."""
    if value is None:
        return None
    if not _is_hex_id(value):
        raise _corrupt(where, "attempt", f"expected an attempt id (hex digits), got {value!r:.40}")
    return value


def _home(value: Any) -> str | None:
    """A home id (1 to 64 lowercase hex digits), or None for anything else: a home only steers
    placement, so a damaged one means "unknown", never a refused checkpoint."""
    return value if _is_hex_id(value) else None


def _is_hex_id(value: Any) -> bool:
    """True for a string of 1 to 64 lowercase hex digits."""
    return isinstance(value, str) and 0 < len(value) <= 64 and not value.strip("0123456789abcdef")


def _transactions(value: Any, where: str) -> dict[str, dict[str, Any]]:
    """output -> {"id": transactional id, "producer_id": int, "epoch": int}."""
    if not isinstance(value, dict):
        raise _corrupt(where, "transactions", f"expected an object of output -> transaction, got "
                                              f"{type(value).__name__}")
    result = {}
    for name, txn in value.items():
        label = f"transactions.{name}"
        if not isinstance(txn, dict) or set(txn) != {"id", "producer_id", "epoch"}:
            raise _corrupt(where, label, "expected an object with exactly id, producer_id and epoch")
        if not isinstance(txn["id"], str) or not 0 < len(txn["id"]) <= 400:
            raise _corrupt(where, f"{label}.id", f"expected a transactional id, got {txn['id']!r:.40}")
        if type(txn["epoch"]) is not int or not 0 <= txn["epoch"] < 1 << 15:
            raise _corrupt(where, f"{label}.epoch", f"expected a producer epoch (0..32767), got {txn['epoch']!r:.40}")
        result[name] = {"id": txn["id"], "producer_id": _offset(txn["producer_id"], where, f"{label}.producer_id"),
                        "epoch": txn["epoch"]}
    return result


def _manifests(value: Any, where: str) -> dict[str, dict[str, Any]]:
    """store -> manifest object; what a manifest holds is checked by its changelog when it adopts it."""
    if not isinstance(value, dict):
        raise _corrupt(where, "manifests", f"expected an object of store -> manifest, got {type(value).__name__}")
    for name, manifest in value.items():
        if not isinstance(manifest, dict):
            raise _corrupt(where, f"manifests.{name}", f"expected an object, got {type(manifest).__name__}")
    return value


class CheckpointObjects(ABC):
    """Checkpoints kept as immutable objects in durable storage: every save writes a new object and
    the latest one wins; old ones are garbage-collected by the implementation."""

    @abstractmethod
    def latest(self, partition: int) -> tuple[str, bytes] | None:
        """``(where, bytes)`` of the partition's latest checkpoint object, None if it has none."""

    @abstractmethod
    def put(self, partition: int, data: bytes) -> str:
        """Write ``data`` as the partition's new latest checkpoint; returns where it went."""

    @abstractmethod
    def delete_partition(self, partition: int) -> None:
        """Delete every checkpoint object of the partition."""

    @abstractmethod
    def describe(self) -> str:
        """Where the checkpoints live (a URL), for messages and ``localstate inspect``."""


class CheckpointStore:
    """Checkpoints of one job: ``<root>/<partition>.json`` on the local (or a shared) file system, or
    in ``objects`` (durable storage) when given; either way an exclusive lock per partition, held by
    the live instance, in ``root``."""

    def __init__(self, root: Path, anchor: Path | None = None, objects: CheckpointObjects | None = None) -> None:
        """``anchor``: the directory (the state directory) below which no component of ``root`` may
        be a symlink; default ``root`` itself."""
        self.objects = objects
        self.root = Path(root)
        self.anchor = Path(anchor) if anchor is not None else self.root
        try:
            ensure_dir(self.anchor, self.root)
        except OSError as exc:
            raise os_error(exc, "create the checkpoint directory", self.root, CheckpointIOError) from exc
        self._locks: dict[int, int] = {}

    def path(self, partition: int) -> Path:
        return safe_join(self.root, f"{int(partition)}.json", anchor=self.anchor)

    def lock(self, partition: int) -> None:
        """Take the partition's instance lock: a second live instance of the partition is refused."""
        if partition in self._locks:
            return
        lock_path = safe_join(self.root, f"{int(partition)}.lock", anchor=self.anchor)
        try:
            fd = open_nofollow(lock_path, os.O_CREAT | os.O_RDWR, 0o644)
        except OSError as exc:
            raise os_error(exc, "open the instance lock", lock_path, CheckpointIOError, partition=partition) from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            os.close(fd)
            raise FencedError(f"another live instance holds task partition {partition}",
                              partition=partition, path=str(self.root),
                              hint="stop the other instance (or wait for it to die) before starting this one") from exc
        retired = self.retired()
        if retired is not None:
            os.close(fd)
            raise FencedError(f"task partition {partition}: this state was replaced ({retired})", partition=partition,
                              path=str(self.root), hint="start the job again: it then reads its current state")
        self._locks[partition] = fd

    def retire(self, note: str) -> None:
        """Mark these checkpoints as replaced by a newer generation of the job's state (a rescale):
        every later :meth:`lock` is refused, so a run that started before cannot go on writing here."""
        write_atomic(safe_join(self.root, RETIRED, anchor=self.anchor), note.encode("utf-8"), error=CheckpointIOError)

    def retired(self) -> str | None:
        """Why these checkpoints were retired (:meth:`retire`), None if they were not."""
        try:
            return read_nofollow(safe_join(self.root, RETIRED, anchor=self.anchor)).decode("utf-8", "replace")
        except FileNotFoundError:
            return None

    def unlock(self, partition: int) -> None:
        fd = self._locks.pop(partition, None)
        if fd is not None:
            os.close(fd)  # closing releases the flock

    def load(self, partition: int) -> Checkpoint | None:
        if self.objects is not None:
            found = self.objects.latest(partition)
            if found is None:
                return None
            path, data = found
        else:
            path = str(self.path(partition))
            try:
                data = read_nofollow(Path(path))
            except FileNotFoundError:
                return None
            except OSError as exc:
                raise CheckpointError(f"cannot read checkpoint {path}: {exc}", partition=partition, path=path,
                                      hint="check the file's permissions and disk") from exc
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise _corrupt(path, "", f"not UTF-8: {exc}") from exc
        checkpoint = Checkpoint.from_json(text, path)
        if checkpoint.partition != partition:
            raise CheckpointError(f"checkpoint {path} belongs to partition {checkpoint.partition}",
                                  partition=partition, path=path, field="partition",
                                  hint="put the file back where it came from")
        return checkpoint

    def load_all(self, partitions: int) -> dict[int, Checkpoint | None]:
        """The committed checkpoint of each of ``partitions`` partitions (None: never committed)."""
        return {partition: self.load(partition) for partition in range(partitions)}

    def save(self, checkpoint: Checkpoint, *, expect_generation: int | None = None) -> None:
        """Write atomically. With ``expect_generation``, refuse (FencedError) if a newer generation
        has been written meanwhile by another instance."""
        if expect_generation is not None:
            current = self.load(checkpoint.partition)
            if current is not None and current.generation > expect_generation:
                raise FencedError(f"task partition {checkpoint.partition} was taken over by generation "
                                  f"{current.generation}; this instance is generation {expect_generation}",
                                  partition=checkpoint.partition,
                                  hint="this instance is stale; stop it (its uncommitted work is discarded)")
        if self.objects is not None:
            self.objects.put(checkpoint.partition, checkpoint.to_json().encode("utf-8"))
            return
        write_atomic(self.path(checkpoint.partition), checkpoint.to_json().encode("utf-8"), error=CheckpointIOError)

    def delete(self, partition: int) -> None:
        if self.objects is not None:
            self.objects.delete_partition(partition)
        path = self.path(partition)
        try:
            path.unlink(missing_ok=True)
        except OSError as exc:
            raise os_error(exc, "delete checkpoint", path, CheckpointIOError, partition=partition) from exc

    def describe(self) -> dict[str, Any]:
        if self.objects is not None:
            return {"path": self.objects.describe(), "locks": str(self.root)}
        return {"path": str(self.root)}
