"""Reading a savepoint: only a whole one.

:meth:`Savepoint.open` reads the manifest and checks every file it lists (present, its size, its
sha256) before anything of the savepoint is used; a savepoint without a manifest (cut short), with a
file missing, truncated or altered, is refused with :class:`SavepointCorruptError`, one of a newer
format with :class:`SavepointFormatError`. Reading is read-only.
"""

from __future__ import annotations

import hashlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Iterator

from localstate.errors import SavepointCorruptError
from localstate.runtime.statedata.columns import from_parquet
from localstate.runtime.statedata.location import SavepointLocation
from localstate.runtime.statedata.manifest import MANIFEST, SavepointManifest
from localstate.runtime.statedata.saved import SavedState

__all__ = ["Savepoint", "find_savepoints"]


class Savepoint(SavedState):
    """A whole savepoint at a location: its manifest, and its records by store and partition."""

    def __init__(self, location: SavepointLocation, manifest: SavepointManifest) -> None:
        self.location = location
        self.manifest = manifest

    @classmethod
    def open(cls, location: SavepointLocation, *, verify: bool = True) -> "Savepoint":
        """The savepoint at ``location``, checked (``verify``: every file's size and sha256 too)."""
        data = location.get(MANIFEST)
        if data is None:
            found = location.keys()
            what = (f"holds {len(found)} file(s) but no {MANIFEST}: a savepoint cut short (its manifest is written "
                    "last)") if found else "holds no savepoint"
            raise SavepointCorruptError(f"savepoint location {location.where()} {what}", path=location.where(),
                                        hint="take the savepoint again, to a new location; delete what a savepoint "
                                             "cut short left")
        savepoint = cls(location, SavepointManifest.from_json(data, location.where(MANIFEST)))
        if verify:
            savepoint.verify()
        return savepoint

    def verify(self) -> None:
        """SavepointCorruptError naming the first file that is missing, of another size or fails its
        sha256 (files are hashed two at a time)."""
        present = dict(self.location.keys("stores"))
        for key, entry in self.manifest.files.items():
            size = present.get(key)
            if size is None:
                raise self._bad(key, "is missing")
            if size != entry.bytes:
                raise self._bad(key, f"has {size} bytes, the manifest says {entry.bytes} (truncated or replaced)")
        with ThreadPoolExecutor(max_workers=2) as pool:
            for key, digest in zip(self.manifest.files, pool.map(self._digest, self.manifest.files)):
                if digest != self.manifest.files[key].sha256:
                    raise self._bad(key, "fails its sha256 (altered or damaged)")

    def _digest(self, key: str) -> str | None:
        data = self.location.get(key)
        return None if data is None else hashlib.sha256(data).hexdigest()

    def _bad(self, key: str, problem: str) -> SavepointCorruptError:
        return SavepointCorruptError(f"savepoint {self.location.where()}: file {key} {problem}",
                                     path=self.location.where(key),
                                     hint="the savepoint is not whole: use an intact copy, or take it again")

    def where(self) -> str:
        return self.location.where()

    def records(self, store: str, partition: int) -> Iterator[tuple[list[bytes], list[bytes]]]:
        """The raw records of a store partition, file by file (keys in byte order within a file)."""
        for key in self.manifest.store_files(store, partition):
            data = self.location.get(key)
            if data is None:
                raise self._bad(key, "is missing")
            yield from_parquet(data)

    def describe(self) -> dict[str, Any]:
        """What ``localstate savepoint --list`` and ``inspect --savepoint`` show."""
        manifest = self.manifest
        return {"location": self.location.where(), "job": manifest.job, "partitions": manifest.partitions,
                "epoch": manifest.epoch, "created": manifest.created, "changelog_system": manifest.changelog_system,
                "stores": {name: {"engine": entry.engine, "records": entry.records, "key_serde": entry.key_serde,
                                  "value_serde": entry.value_serde, "state_format": entry.state_format}
                           for name, entry in manifest.stores.items()},
                "files": len(manifest.files), "bytes": sum(entry.bytes for entry in manifest.files.values()),
                "checkpoints": {p: None if c is None else {"inputs": c.inputs, "watermark": c.watermark,
                                                            "next_timer": c.next_timer, "batch": c.batch}
                                for p, c in manifest.checkpoints.items()}}


def find_savepoints(folder: SavepointLocation) -> list[tuple[str, bool]]:
    """``(path below folder, whole)`` of every savepoint found under ``folder``: a manifest means a
    savepoint (whole if its files check out: see :meth:`Savepoint.open`), a ``stores/`` tree without
    one a savepoint cut short."""
    found: dict[str, bool] = {}
    for key, _ in folder.keys():
        parts = Path(key).parts
        if parts and parts[-1] == MANIFEST:
            found[str(Path(*parts[:-1])) if len(parts) > 1 else "."] = True
        elif "stores" in parts:
            root = parts[:parts.index("stores")]
            found.setdefault(str(Path(*root)) if root else ".", False)
    return sorted(found.items())
