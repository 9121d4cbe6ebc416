"""Damaged local state: how an engine reports it and how the next open learns about it.

Local state is a cache of the changelog. When an engine discovers damage while the task runs (a
RocksDB block checksum, a corrupt LMDB page, an unreadable tantivy segment) it calls
:func:`store_corrupt`: that leaves a marker file in the engine's directory and returns a
:class:`~localstate.errors.StoreCorruptError` to raise. The task attempt fails; the next open of the
store (the retry) finds the marker, discards the directory and the runtime rebuilds the store from
the changelog. The marker is what makes the retry rebuild instead of trusting the damaged files again.
"""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

from localstate.errors import StoreCorruptError

__all__ = ["CORRUPT_MARKER", "mark_corrupt", "corrupt_reason", "store_corrupt", "wipe_local"]

log = logging.getLogger(__name__)

CORRUPT_MARKER = "LOCALSTATE_CORRUPT"
"""File left in an engine directory whose local state was found damaged."""


def mark_corrupt(directory: Path, reason: str) -> None:
    """Leave the marker in ``directory`` (best effort: a failure only means the damage is found
    again, and reported again, on the next use). Never follows a symlink planted at its name."""
    data = (reason[:2000] + "\n").encode("utf-8", "backslashreplace")
    try:
        fd = os.open(Path(directory) / CORRUPT_MARKER, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
    except OSError as exc:
        log.warning("cannot mark %s as corrupt: %s", directory, exc)


def corrupt_reason(directory: Path) -> str | None:
    """Why ``directory`` was marked corrupt, or None when it was not (a symlink marker is ignored:
    only a file localstate wrote counts)."""
    path = Path(directory) / CORRUPT_MARKER
    if not path.is_file() or path.is_symlink():
        return None
    try:
        return path.read_text(encoding="utf-8", errors="replace").strip() or "unknown damage"
    except OSError:
        return "unknown damage"


def store_corrupt(directory: Path, engine: str, detail: object, *, store: str = "",
                  partition: int | None = None) -> StoreCorruptError:
    """Mark ``directory`` corrupt and return the error to raise."""
    reason = f"{engine}: {detail}"
    mark_corrupt(directory, reason)
    log.warning("store %s partition %s: local %s state is damaged (%s); it will be rebuilt from the "
                "changelog when the store is next opened", store, partition, engine, detail)
    return StoreCorruptError(f"local {engine} state of store {store!r} is damaged: {str(detail)[:300]}",
                             store=store or None, partition=partition, path=str(directory),
                             hint="nothing to fix by hand: local state is a cache of the changelog; the retried "
                                  "task (or the next run) discards it and rebuilds it from the changelog")



def wipe_local(directory: Path, what: str, reason: str | None, *, store: str | None = "",
               partition: int | None = None) -> None:
    """Throw away the local state in ``directory`` (``what``: e.g. "RocksDB", "index") and leave it
    empty, with one warning saying why (none when ``reason`` is None: the caller already said why).
    Callers decide *whether* to wipe; this is *how*: local state is only a cache of the changelog, so
    the store is rebuilt from it. ``rmtree`` removes symlinks inside the directory, never their targets."""
    directory = Path(directory)
    if reason is not None:
            log.warning("store %s partition %s: discarding local %s at %s (%s); it will be rebuilt from the "
                    "changelog", store, partition, what, directory, reason)
    try:
        shutil.rmtree(directory)
    except FileNotFoundError:
        pass
    directory.mkdir(parents=True, exist_ok=True)
