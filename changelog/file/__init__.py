"""The file changelog: the embedded default changelog system, also the format of job input/output
streams (``streams.py``: the ``file`` stream system). See docs/changelog.md."""

from __future__ import annotations

from .compaction import BackgroundCompactor, CompactionStats, compact_partition, compact_stream
from .partition import FileChangelogPartition
from .system import FileChangelogSystem

__all__ = [
    "FileChangelogSystem",
    "FileChangelogPartition",
    "CompactionStats",
    "compact_partition",
    "compact_stream",
    "BackgroundCompactor",
]
