"""The file changelog's segment files: their names and listing. A segment is a plain concatenation of
records in the shared changelog record format (``localstate.changelog.framing``: the layout, the
encoder, the validating walk and the decoders, in C and in their Python reference), no file header.

The framing names are re-exported here for the file changelog's code and its existing callers.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from localstate.changelog.framing import (
    HEADER,
    HEADER_SIZE,
    MAX_KEY,
    MAX_VALUE,
    NATIVE,
    REST,
    TOMBSTONE,
    count_records,
    encode_into,
    find_valid_after,
    py_encode_into,
    py_walk,
    valid_record_at,
    walk,
)

__all__ = [
    "HEADER",
    "HEADER_SIZE",
    "REST",
    "TOMBSTONE",
    "MAX_KEY",
    "MAX_VALUE",
    "SEGMENT_SUFFIX",
    "segment_name",
    "list_segments",
    "valid_record_at",
    "walk",
    "py_walk",
    "find_valid_after",
    "encode_into",
    "py_encode_into",
    "count_records",
    "NATIVE",
]

SEGMENT_SUFFIX = ".log"
_SEGMENT_RE = re.compile(r"^(\d{20})\.log$")


def segment_name(base: int) -> str:
    """File name of the segment whose first offset is ``base``."""
    return f"{base:020d}{SEGMENT_SUFFIX}"


def list_segments(directory: Path) -> list[int]:
    """Sorted base offsets of the segment files in ``directory`` (temp files are ignored)."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    bases = []
    for name in names:
        match = _SEGMENT_RE.match(name)
        if match:
            bases.append(int(match.group(1)))
    bases.sort()
    return bases
