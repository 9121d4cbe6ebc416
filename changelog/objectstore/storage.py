"""Immutable objects under one base location, on any ``pyarrow.fs`` file system: a local or shared
directory (``/mnt/shared/x``, ``file:///mnt/shared/x``), S3-compatible storage (``s3://bucket/prefix``
with an ``endpoint``), HDFS (``hdfs://namenode:8020/path``) or any fsspec file system
(``<protocol>://...`` when fsspec knows the protocol).

Objects are written whole and never appended to or overwritten (every name this package writes
carries a fresh writer token), so no storage needs shared appends, leases or locks. On a local or
NFS directory an object is written to a temporary file, fsynced and renamed, so a reader never
sees half of one; on object stores a PUT is atomic by itself.
"""

from __future__ import annotations

import logging
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping
from urllib.parse import urlparse

import pyarrow.fs as pafs

from localstate.core.fsutil import ensure_dir, open_nofollow, read_nofollow, write_atomic
from localstate.errors import ChangelogError, ConfigError

__all__ = ["ObjectInfo", "ObjectStore", "open_object_store", "check_key"]

#: One key component: what localstate's naming scheme produces (stream names, digits, object names).
log = logging.getLogger(__name__)

# A GET is idempotent: a remote store's transient failure (a dropped connection, a server that is
# restarting) is retried a few times before the read fails the task.
READ_ATTEMPTS = 3
READ_BACKOFF_SECONDS = 0.25

_COMPONENT = re.compile(r"^[A-Za-z0-9_.=-]{1,200}$")


def check_key(key: str) -> str:
    """``key`` if every ``/``-separated component is a plain name (no ``..``, no empty part), else
    ChangelogError: a key never leaves the store's base location."""
    parts = key.split("/")
    if not parts or any(not _COMPONENT.match(part) or part in (".", "..") for part in parts):
        raise ChangelogError(f"invalid object key {key!r}", path=key,
                             hint="object keys are built by localstate; a manifest naming another key is corrupt")
    return key


@dataclass(frozen=True)
class ObjectInfo:
    """One stored object: its key below the base, size in bytes, modification time (epoch seconds;
    None when the file system does not say)."""

    key: str
    size: int
    mtime: float | None


class ObjectStore:
    """Whole-object put/get/list/delete below ``base`` of a ``pyarrow.fs`` file system."""

    def __init__(self, fs: pafs.FileSystem, base: str, url: str, spec: Mapping[str, Any] | None = None) -> None:
        self.fs = fs
        # How to open this store again in another process (the compactor): the storage options and
        # state_dir given to open_object_store, JSON-able; None for a store built otherwise.
        self.spec = dict(spec) if spec is not None else None
        self.base = base.rstrip("/")
        self.url = url.rstrip("/")
        # A local (or NFS-mounted) directory is written with fsync + rename and never through a symlink.
        self.local_root = Path(self.base) if isinstance(fs, pafs.LocalFileSystem) else None

    def where(self, key: str) -> str:
        """The object's full URL, for messages."""
        return f"{self.url}/{key}"

    def _path(self, key: str) -> str:
        return f"{self.base}/{check_key(key)}"

    def put(self, key: str, data: bytes | bytearray | memoryview) -> None:
        """Write a new object (durable and whole when this returns)."""
        try:
            if self.local_root is not None:
                path = self.local_root / check_key(key)
                ensure_dir(self.local_root, path.parent)
                write_atomic(path, bytes(data), error=ChangelogError)
                return
            with self.fs.open_output_stream(self._path(key)) as out:
                out.write(data)
        except ChangelogError:
            raise
        except OSError as exc:
            raise ChangelogError(f"cannot write object {self.where(key)}: {exc}", path=self.where(key),
                                 hint="check that the storage is reachable, writable and the credentials valid; "
                                      "the commit failed and is retried from the last checkpoint") from exc

    def get(self, key: str) -> bytes:
        """The whole object; FileNotFoundError if it does not exist, ChangelogError if unreadable
        (a remote read is tried :data:`READ_ATTEMPTS` times first)."""
        if self.local_root is not None:
            return self._get_once(key)
        for attempt in range(1, READ_ATTEMPTS + 1):
            try:
                return self._get_once(key)
            except ChangelogError as exc:
                if attempt == READ_ATTEMPTS:
                    raise
                log.info("reading %s failed (%s); retrying (attempt %d of %d)", self.where(key), exc.message,
                         attempt + 1, READ_ATTEMPTS)
                time.sleep(READ_BACKOFF_SECONDS * 2 ** (attempt - 1))
        raise AssertionError("unreachable")

    def _get_once(self, key: str) -> bytes:
        try:
            if self.local_root is not None:
                return read_nofollow(self.local_root / check_key(key))
            with self.fs.open_input_stream(self._path(key)) as source:
                return source.read()
        except FileNotFoundError:
            raise
        except OSError as exc:
            if _missing(exc):
                raise FileNotFoundError(self.where(key)) from exc
            raise ChangelogError(f"cannot read object {self.where(key)}: {exc}", path=self.where(key),
                                 hint="check that the storage is reachable and the credentials valid") from exc

    def list(self, prefix: str) -> list[ObjectInfo]:
        """Every object below ``prefix`` (recursively), sorted by key; [] if there is none."""
        check_key(prefix)
        selector = pafs.FileSelector(f"{self.base}/{prefix}", recursive=True, allow_not_found=True)
        try:
            infos = self.fs.get_file_info(selector)
        except OSError as exc:
            raise ChangelogError(f"cannot list {self.where(prefix)}: {exc}", path=self.where(prefix),
                                 hint="check that the storage is reachable and the credentials valid") from exc
        out = []
        for info in infos:
            if info.type != pafs.FileType.File:
                continue
            key = info.path[len(self.base) + 1:] if info.path.startswith(self.base + "/") else info.path
            mtime = info.mtime.timestamp() if info.mtime is not None else None
            out.append(ObjectInfo(key, int(info.size or 0), mtime))
        out.sort(key=lambda item: item.key)
        return out

    def delete(self, key: str) -> None:
        """Delete one object (missing is fine)."""
        try:
            if self.local_root is not None:
                path = self.local_root / check_key(key)
                os.close(open_nofollow(path, os.O_RDONLY))  # refuses a symlink planted in its place
                path.unlink()
                return
            self.fs.delete_file(self._path(key))
        except FileNotFoundError:
            return
        except OSError as exc:
            if _missing(exc):
                return
            raise ChangelogError(f"cannot delete object {self.where(key)}: {exc}", path=self.where(key),
                                 hint="check the storage's permissions; the object is deleted again later") from exc


def _missing(exc: OSError) -> bool:
    text = str(exc)
    return "does not exist" in text or "NoSuchKey" in text or "Not Found" in text or "404" in text


def open_object_store(options: Mapping[str, Any], state_dir: Path) -> ObjectStore:
    """The object store of the ``objectstore`` changelog's validated ``options``.

    S3 credentials come from ``access_key``/``secret_key`` when given, else from the usual AWS
    environment variables and files (``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, profiles)."""
    store = _open(options, state_dir)
    store.spec = {"options": {key: options[key] for key in STORAGE_OPTIONS if key in options},
                  "state_dir": str(state_dir)}
    return store


#: The options open_object_store reads (what a compactor subprocess needs to open the same store).
STORAGE_OPTIONS = ("url", "endpoint", "region", "access_key", "secret_key")


def _open(options: Mapping[str, Any], state_dir: Path) -> ObjectStore:
    url: str = options["url"]
    parsed = urlparse(url)
    scheme = parsed.scheme.lower()
    if scheme in ("", "file"):
        path = Path(parsed.path if scheme == "file" else url)
        if not path.is_absolute():
            path = Path(state_dir) / path
        return ObjectStore(pafs.LocalFileSystem(), str(path), f"file://{path}")
    if scheme == "s3":
        if not parsed.netloc:
            raise ConfigError.at("changelogs.objectstore.url", f"{url!r} names no bucket (s3://bucket/prefix)")
        # allow_delayed_open: a PUT without the HEAD requests that look for the "parent directory"
        # first (object stores have none; it halves the latency of a small PUT).
        # background_writes=False: a PUT is already off the hot path (ObjectStoreChangelogPartition.flush
        # runs it on its own thread); pyarrow's extra hop to its I/O pool only adds latency.
        kwargs: dict[str, Any] = {"region": options.get("region") or "us-east-1", "allow_delayed_open": True,
                                  "background_writes": False}
        endpoint = options.get("endpoint")
        if endpoint:
            target = urlparse(endpoint if "://" in endpoint else f"https://{endpoint}")
            kwargs["endpoint_override"] = target.netloc
            kwargs["scheme"] = target.scheme or "https"
        if options.get("access_key"):
            kwargs["access_key"] = options["access_key"]
            kwargs["secret_key"] = options.get("secret_key") or ""
        base = f"{parsed.netloc}/{parsed.path.strip('/')}".rstrip("/")
        return ObjectStore(pafs.S3FileSystem(**kwargs), base, url)
    if scheme in ("hdfs", "viewfs", "gs", "gcs", "abfs", "abfss"):
        try:
            fs, base = pafs.FileSystem.from_uri(url)
        except (OSError, ValueError) as exc:
            raise ConfigError.at("changelogs.objectstore.url", f"cannot open {url!r}: {exc}") from exc
        return ObjectStore(fs, base, url)
    try:
        import fsspec  # noqa: PLC0415 - optional: any other protocol goes through fsspec
    except ImportError as exc:
        raise ConfigError.at("changelogs.objectstore.url",
                             f"unknown scheme {scheme!r} in {url!r}: use a path, file://, s3://, hdfs:// or "
                             "install fsspec for other protocols") from exc
    try:
        fs, base = fsspec.core.url_to_fs(url)
    except (ImportError, ValueError) as exc:
        raise ConfigError.at("changelogs.objectstore.url", f"cannot open {url!r}: {exc}") from exc
    return ObjectStore(pafs.PyFileSystem(pafs.FSSpecHandler(fs)), str(base), url)
