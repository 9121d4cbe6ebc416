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

from localstate.core.config import JobConfig, StoreConfig
from localstate.errors import SavepointCorruptError
from localstate.runtime.statedata.columns import from_parquet
from localstate.runtime.statedata.location import SavepointLocation
from localstate.runtime.statedata.manifest import MANIFEST, SavepointManifest
from localstate.core.policy import PluginPolicy

__all__ = ["Savepoint", "find_savepoints"]


class Savepoint:
    """A whole savepoint at a location: its manifest, and its records by store and partition."""

    def __init__(self, location: SavepointLocation, manifest: SavepointManifest, verify_reads: bool = False) -> None:
        self.location = location
        self.manifest = manifest
        self.verify_reads = verify_reads
        """check each file's size and sha256 when it is read (:meth:`records`)"""

    @classmethod
    def open(cls, location: SavepointLocation, *, verify: bool = True, verify_reads: bool = False) -> "Savepoint":
        """The savepoint at ``location``, checked (``verify``: every file's size and sha256 too, read
        once beforehand; ``verify_reads``: each file's when :meth:`records` reads it, so a reader
        that reads every file before it uses any, such as the start of a job from it, checks each
        file without reading it twice)."""
        data = location.get(MANIFEST)
        if data is None:
            found = location.keys()
            what = (f"holds {len(found)} file(s) but no {MANIFEST}: a savepoint cut short (its manifest is written "
                    "last)") if found else "holds no savepoint"
            raise SavepointCorruptError(f"savepoint location {location.where()} {what}", path=location.where(),
                                        hint="take the savepoint again, to a new location; delete what a savepoint "
                                             "cut short left")
        savepoint = cls(location, SavepointManifest.from_json(data, location.where(MANIFEST)), verify_reads)
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

    def records(self, store: str, partition: int) -> Iterator[tuple[list[bytes], list[bytes]]]:
        """The raw records of a store partition, file by file (keys in byte order within a file)."""
        for key in self.manifest.store_files(store, partition):
            data = self.location.get(key)
            if data is None:
                raise self._bad(key, "is missing")
            if self.verify_reads:
                entry = self.manifest.files[key]
                if len(data) != entry.bytes:
                    raise self._bad(key, f"has {len(data)} bytes, the manifest says {entry.bytes} (truncated or replaced)")
                if hashlib.sha256(data).hexdigest() != entry.sha256:
                    raise self._bad(key, "fails its sha256 (altered or damaged)")
            yield from_parquet(data)

    def entries(self, store: str, partition: int) -> list[tuple[bytes, bytes]]:
        """All raw records of a store partition, in key byte order."""
        out: list[tuple[bytes, bytes]] = []
        for keys, values in self.records(store, partition):
            out.extend(zip(keys, values))
        out.sort()
        return out

    def store_config(self, store: str) -> StoreConfig:
        """The store as the savepoint's job configured it."""
        entry = self.manifest.stores[store]
        return StoreConfig(store, entry.engine, entry.options, store, entry.key_serde, entry.value_serde)

    def job_config(self, plugins: str | None = None) -> Any:
        """A job config holding the savepoint's job as it was (its name, partition count and stores),
        for readers that decode its records; nothing of it runs."""
        manifest = self.manifest
        policy = PluginPolicy.discover(plugins) if plugins else PluginPolicy()
        return JobConfig(name=manifest.job, partitions=manifest.partitions, task="unused:Unused",
                         state_dir=Path("."), stores={name: self.store_config(name) for name in manifest.stores},
                         policy=policy)

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
