"""The savepoint manifest (``savepoint.json``): what a savepoint holds, written last.

A savepoint is whole iff its manifest exists and every file it lists is present with its size and
sha256; :meth:`SavepointManifest.from_json` refuses a manifest of another format or a damaged one,
and :class:`~localstate.runtime.statedata.reader.Savepoint` checks the files.

Layout below the savepoint's location::

    savepoint.json                                     this manifest (written last)
    stores/<store>/partition=<p>/part-<n:05d>.parquet   each store partition's records (Hive-style
                                                       partitions: Spark, pandas and DuckDB read
                                                       ``stores/<store>`` as one table)
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Mapping

from localstate.core.checkpoint import Checkpoint
from localstate.errors import SavepointCorruptError, SavepointFormatError

__all__ = ["FORMAT", "MANIFEST", "PARTITIONER", "StoreEntry", "FileEntry", "SavepointManifest", "data_key",
           "store_prefix"]

FORMAT = 1
"""The savepoint format this version writes and reads (a newer one is refused)."""
MANIFEST = "savepoint.json"
PARTITIONER = "kafka-murmur2"
"""The partitioner every localstate job routes keys with (:mod:`localstate.core.partitioner`)."""
KIND = "localstate-savepoint"


def store_prefix(store: str) -> str:
    return f"stores/{store}"


def data_key(store: str, partition: int, part: int) -> str:
    """Where part ``part`` of a store partition's records is kept."""
    return f"{store_prefix(store)}/partition={int(partition)}/part-{int(part):05d}.parquet"


@dataclass(frozen=True)
class StoreEntry:
    """One store as the job configured it when the savepoint was taken."""

    engine: str
    options: dict[str, Any]
    key_serde: str
    value_serde: str
    state_format: str | None = None
    """how the engine laid out its stored values (:class:`~localstate.core.engine.StateFormat`)"""
    records: int = 0
    columns: list[str] = field(default_factory=list)
    """the decoded columns beside ``key_bytes`` and ``value_bytes``"""


@dataclass(frozen=True)
class FileEntry:
    sha256: str
    bytes: int
    rows: int


@dataclass(frozen=True)
class SavepointManifest:
    """Everything a savepoint says about itself; ``checkpoints[p]`` is partition ``p``'s committed
    checkpoint the savepoint was read at (None: the partition never committed)."""

    job: str
    partitions: int
    stores: dict[str, StoreEntry]
    checkpoints: dict[int, Checkpoint | None]
    files: dict[str, FileEntry]
    epoch: int = 0
    changelog_system: str = ""
    timer_key_serde: str = "json"
    created: float = field(default_factory=time.time)
    partitioner: str = PARTITIONER
    inputs: dict[str, dict[str, Any]] = field(default_factory=dict)
    """input -> ``{"place": "<kind>:<where>" or None, "lag": {partition: records past the checkpoint,
    or None when unknown}}`` when the savepoint was taken: a start with another partition count
    requires every lag to be 0 (the job drained) and refuses an input still read at ``place``"""

    def to_json(self) -> bytes:
        data = {
            "format": FORMAT, "kind": KIND, "job": self.job, "partitions": self.partitions,
            "partitioner": self.partitioner, "epoch": self.epoch, "changelog_system": self.changelog_system,
            "timer_key_serde": self.timer_key_serde, "created": self.created,
            "created_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.created)),
            "stores": {name: asdict(entry) for name, entry in sorted(self.stores.items())},
            "checkpoints": {str(p): None if c is None else json.loads(c.to_json())
                            for p, c in sorted(self.checkpoints.items())},
            "files": {key: asdict(entry) for key, entry in sorted(self.files.items())},
            "inputs": self.inputs,
        }
        return json.dumps(data, sort_keys=True, indent=1, default=_jsonable).encode()

    @classmethod
    def from_json(cls, data: bytes, where: str) -> "SavepointManifest":
        """Parse and check a manifest: SavepointFormatError for another format, SavepointCorruptError
        for anything malformed (naming ``where`` and the field)."""
        try:
            raw = json.loads(data)
        except (ValueError, RecursionError) as exc:
            raise _corrupt(where, "", f"not JSON: {exc}") from exc
        if not isinstance(raw, dict) or raw.get("kind") != KIND:
            raise _corrupt(where, "kind", "not a localstate savepoint manifest")
        version = raw.get("format")
        if type(version) is not int:
            raise _corrupt(where, "format", f"expected an integer, got {version!r:.40}")
        if version > FORMAT:
            raise SavepointFormatError(
                f"savepoint {where} has format {version}; this localstate reads format {FORMAT} and older",
                path=where, format=version, hint="read it with the newer localstate that wrote it (or upgrade)")
        try:
            partitions = raw["partitions"]
            if type(partitions) is not int or not 1 <= partitions <= 100_000:
                raise ValueError(f"partitions: expected 1..100000, got {partitions!r:.40}")
            stores = {str(name): StoreEntry(**entry) for name, entry in _mapping(raw, "stores").items()}
            files = {str(key): FileEntry(**entry) for key, entry in _mapping(raw, "files").items()}
            checkpoints: dict[int, Checkpoint | None] = {}
            for key, value in _mapping(raw, "checkpoints").items():
                partition = int(key)
                checkpoints[partition] = None if value is None else \
                    Checkpoint.from_json(json.dumps(value), f"{where} checkpoints.{partition}")
            if sorted(checkpoints) != list(range(partitions)):
                raise ValueError(f"checkpoints: expected partitions 0..{partitions - 1}")
            for key, entry in files.items():
                if not (isinstance(entry.sha256, str) and len(entry.sha256) == 64 and type(entry.bytes) is int
                        and type(entry.rows) is int) or not key.startswith("stores/"):
                    raise ValueError(f"files.{key}: malformed")
            return cls(job=str(raw["job"]), partitions=partitions, stores=stores, checkpoints=checkpoints,
                       files=files, epoch=int(raw.get("epoch", 0)), changelog_system=str(raw.get("changelog_system", "")),
                       timer_key_serde=str(raw.get("timer_key_serde", "json")), created=float(raw.get("created", 0)),
                       partitioner=str(raw.get("partitioner", PARTITIONER)),
                       inputs={str(name): dict(value) for name, value in raw.get("inputs", {}).items()})
        except (KeyError, TypeError, ValueError) as exc:
            raise _corrupt(where, "", f"{type(exc).__name__}: {exc}") from exc

    def store_files(self, store: str, partition: int) -> list[str]:
        """The keys of a store partition's files, in order."""
        prefix = f"{store_prefix(store)}/partition={int(partition)}/"
        return sorted(key for key in self.files if key.startswith(prefix))


def _mapping(raw: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    value = raw.get(name)
    if not isinstance(value, dict):
        raise ValueError(f"{name}: expected an object")
    return value


def _jsonable(value: Any) -> Any:
    """Store options that are not JSON by themselves (sets, paths) as JSON-able values."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    return str(value)


def _corrupt(where: str, field_name: str, problem: str) -> SavepointCorruptError:
    label = f" field {field_name!r}" if field_name else ""
    return SavepointCorruptError(f"savepoint manifest {where} is corrupt:{label} {problem}", path=where,
                                 hint="take the savepoint again (`localstate savepoint JOB --to PATH`), or use an "
                                      "intact copy")
