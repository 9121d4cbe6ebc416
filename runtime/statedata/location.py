"""Where a savepoint is kept: a local folder or any URL the ``objectstore`` changelog takes
(``s3://bucket/prefix`` with an endpoint, ``hdfs://``, any fsspec protocol), through the same
whole-object storage (:class:`~localstate.changelog.objectstore.storage.ObjectStore`): every file is
written whole (on a folder: a temporary file, fsync, rename; on object storage: one PUT), so a
reader never sees half of one, and nothing is written through a symlink."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping

import pyarrow.fs as pafs

from localstate.changelog.objectstore.storage import STORAGE_OPTIONS, ObjectStore, open_object_store
from localstate.errors import ChangelogError, ConfigError, SavepointError

__all__ = ["SavepointLocation", "storage_options"]


def storage_options(url: str, job: Any = None, **given: Any) -> dict[str, Any]:
    """The storage options of a savepoint at ``url``: those ``given`` (``endpoint``, ``region``,
    ``access_key``, ``secret_key``; None values ignored), else, for an ``s3://`` URL, those of the
    job's ``[changelogs.objectstore]`` table, so a job on object storage keeps its savepoints there
    with the same credentials."""
    options: dict[str, Any] = {"url": url}
    if url.startswith("s3://") and job is not None:
        table = dict(job.changelog_options.get("objectstore", {}))
        options.update({key: table[key] for key in STORAGE_OPTIONS if key != "url" and table.get(key)})
    options.update({key: value for key, value in given.items() if value})
    return options


class SavepointLocation:
    """Whole files below one savepoint location; every failure is a :class:`SavepointError`."""

    def __init__(self, options: Mapping[str, Any], base: Path | None = None) -> None:
        """``options``: ``url`` plus storage options (:func:`storage_options`); a relative path is
        below ``base`` (default: the working directory)."""
        url = str(options["url"])
        self.url = url
        try:
            self.store: ObjectStore = open_object_store(dict(options), Path(base or os.getcwd()))
        except ConfigError as exc:
            raise SavepointError(f"cannot use savepoint location {url!r}: {exc.message}", path=url,
                                 hint="give a folder, file://, s3://bucket/prefix (with --endpoint for the "
                                      "non-AWS server), hdfs:// or the URL of any fsspec file system") from exc

    def where(self, key: str = "") -> str:
        return self.store.where(key) if key else self.store.url

    @property
    def spec(self) -> dict[str, Any]:
        """How to open this location again in another process (a Spark task)."""
        return dict((self.store.spec or {}).get("options", {"url": self.url}))

    def put(self, key: str, data: bytes) -> None:
        try:
            self.store.put(key, data)
        except ChangelogError as exc:
            raise self._error(exc, "write") from exc

    def get(self, key: str) -> bytes | None:
        """The file's bytes, None if it does not exist."""
        try:
            return self.store.get(key)
        except FileNotFoundError:
            return None
        except ChangelogError as exc:
            raise self._error(exc, "read") from exc

    def delete(self, key: str) -> None:
        try:
            self.store.delete(key)
        except ChangelogError as exc:
            raise self._error(exc, "delete") from exc

    def keys(self, prefix: str = "") -> list[tuple[str, int]]:
        """``(key, bytes)`` of every file below the location (or below ``prefix``), sorted."""
        base = self.store.base + (f"/{prefix}" if prefix else "")
        selector = pafs.FileSelector(base, recursive=True, allow_not_found=True)
        try:
            infos = self.store.fs.get_file_info(selector)
        except OSError as exc:
            raise SavepointError(f"cannot list savepoint location {self.where(prefix)}: {exc}",
                                 path=self.where(prefix), hint="check that it is reachable and the credentials "
                                                               "valid") from exc
        start = len(self.store.base) + 1
        return sorted((info.path[start:], int(info.size or 0)) for info in infos
                      if info.type == pafs.FileType.File and info.path.startswith(self.store.base + "/"))

    def _error(self, exc: ChangelogError, action: str) -> SavepointError:
        where = exc.context.get("path", self.url)
        return SavepointError(f"cannot {action} savepoint file {where}: {exc.message}", path=where,
                              hint="check that the savepoint location is reachable, writable and the credentials "
                                   "valid")
