"""The file changelog's segment files: their names and listing. A segment is a plain concatenation of
records in the shared changelog record format (``localstate.changelog.framing``: the layout, the
encoder, the validating walk and the decoders, in C and in their Python reference), no file header.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

__all__ = ["SEGMENT_SUFFIX", "segment_name", "list_segments"]

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
