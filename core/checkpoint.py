"""Checkpoints: the commit point of one task partition.

A checkpoint records, consistently with each other, the next input offset of every input stream
partition, the changelog end offset of every logged store, the output positions, and a generation
number that fences stale instances. It is written atomically (temp file, fsync, rename, fsync dir),
so a reader sees either the previous or the new checkpoint, never a mix.
"""

from __future__ import annotations

import fcntl
import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from localstate.core.fsutil import os_error, write_atomic
from localstate.core.names import safe_join
from localstate.errors import CheckpointError, CheckpointIOError, FencedError

__all__ = ["Checkpoint", "CheckpointStore"]

_FORMAT = 1


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

    def to_json(self) -> str:
        return json.dumps({"format": _FORMAT, **asdict(self)}, sort_keys=True)

    @classmethod
    def from_json(cls, text: str, where: str) -> "Checkpoint":
        try:
            data = json.loads(text)
            if data.pop("format") != _FORMAT:
                raise ValueError("unknown checkpoint format")
            return cls(partition=int(data["partition"]), generation=int(data["generation"]),
                       inputs={str(k): int(v) for k, v in data["inputs"].items()},
                       changelogs={str(k): int(v) for k, v in data["changelogs"].items()},
                       outputs={str(k): int(v) for k, v in data.get("outputs", {}).items()})
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise CheckpointError(f"checkpoint {where} is corrupt: {exc}", path=where,
                                  hint="restore the file from a backup, or reset the job with "
                                       "`localstate reset` (state is then rebuilt from scratch)") from exc


class CheckpointStore:
    """Checkpoints of one job on the local (or a shared) file system:
    ``<root>/<partition>.json``, with an exclusive lock per partition held by the live instance."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise os_error(exc, "create the checkpoint directory", self.root, CheckpointIOError) from exc
        self._locks: dict[int, int] = {}

    def path(self, partition: int) -> Path:
        return safe_join(self.root, f"{int(partition)}.json")

    def lock(self, partition: int) -> None:
        """Take the partition's instance lock: a second live instance of the partition is refused."""
        if partition in self._locks:
            return
        lock_path = self.root / f"{int(partition)}.lock"
        try:
            fd = os.open(lock_path, os.O_CREAT | os.O_RDWR, 0o644)
        except OSError as exc:
            raise os_error(exc, "open the instance lock", lock_path, CheckpointIOError, partition=partition) from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            os.close(fd)
            raise FencedError(f"another live instance holds task partition {partition}",
                              partition=partition, path=str(self.root),
                              hint="stop the other instance (or wait for it to die) before starting this one") from exc
        self._locks[partition] = fd

    def unlock(self, partition: int) -> None:
        fd = self._locks.pop(partition, None)
        if fd is not None:
            os.close(fd)  # closing releases the flock

    def load(self, partition: int) -> Checkpoint | None:
        path = self.path(partition)
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return None
        except (OSError, UnicodeDecodeError) as exc:
            raise CheckpointError(f"cannot read checkpoint {path}: {exc}", partition=partition, path=str(path),
                                  hint="check the file's permissions and disk") from exc
        checkpoint = Checkpoint.from_json(text, str(path))
        if checkpoint.partition != partition:
            raise CheckpointError(f"checkpoint {path} belongs to partition {checkpoint.partition}",
                                  partition=partition, hint="put the file back where it came from")
        return checkpoint

    def save(self, checkpoint: Checkpoint, *, expect_generation: int | None = None) -> None:
        """Write atomically. With ``expect_generation``, refuse (FencedError) if a newer generation
        has been written meanwhile by another instance."""
        path = self.path(checkpoint.partition)
        if expect_generation is not None:
            current = self.load(checkpoint.partition)
            if current is not None and current.generation > expect_generation:
                raise FencedError(f"task partition {checkpoint.partition} was taken over by generation "
                                  f"{current.generation}; this instance is generation {expect_generation}",
                                  partition=checkpoint.partition,
                                  hint="this instance is stale; stop it (its uncommitted work is discarded)")
        write_atomic(path, checkpoint.to_json().encode("utf-8"), error=CheckpointIOError)

    def delete(self, partition: int) -> None:
        path = self.path(partition)
        try:
            path.unlink(missing_ok=True)
        except OSError as exc:
            raise os_error(exc, "delete checkpoint", path, CheckpointIOError, partition=partition) from exc

    def describe(self) -> dict[str, Any]:
        return {"path": str(self.root)}
