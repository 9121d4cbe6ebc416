"""Shared fixtures of the file-changelog tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from localstate.changelog.file import FileChangelogSystem


def state(records) -> dict[bytes, bytes]:  # noqa: ANN001
    """What a restore produces: last record per key wins, tombstones delete."""
    result: dict[bytes, bytes] = {}
    for record in records:
        if record.value is None:
            result.pop(record.key, None)
        else:
            result[record.key] = record.value
    return result


@pytest.fixture
def system(tmp_path: Path) -> FileChangelogSystem:
    s = FileChangelogSystem({"fsync": False}, tmp_path)
    yield s
    s.close()


@pytest.fixture
def small(tmp_path: Path) -> FileChangelogSystem:
    """Tiny segments so that a few records roll several segments."""
    s = FileChangelogSystem({"fsync": False, "segment_bytes": 300}, tmp_path)
    yield s
    s.close()
