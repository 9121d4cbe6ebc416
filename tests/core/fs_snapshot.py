"""Test helper: a listing of a directory tree precise enough to show that nothing changed in it."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path


def snapshot(directory: Path) -> dict[str, tuple]:
    """Every entry under ``directory``: type, size, mtime and content hash (files), link target."""
    entries = {}
    for folder, dirs, files in os.walk(directory):
        for name in dirs + files:
            path = Path(folder) / name
            stat = os.lstat(path)
            if path.is_symlink():
                entries[str(path)] = ("link", os.readlink(path))
            elif path.is_dir():
                entries[str(path)] = ("dir", stat.st_mtime_ns)
            else:
                entries[str(path)] = ("file", stat.st_size, stat.st_mtime_ns,
                                      hashlib.sha256(path.read_bytes()).hexdigest())
    return entries
