"""Subprocess for the kill -9 test: append+flush forever, print every flushed end offset."""

import sys
from pathlib import Path

from localstate.changelog.file import FileChangelogSystem


def record(offset: int) -> tuple[bytes, bytes | None]:
    """Deterministic content of the record at ``offset`` (so a reader can verify it)."""
    if offset % 13 == 0:
        return b"k%d" % (offset % 1000), None
    return b"k%d" % (offset % 1000), (b"%d:" % offset) * (1 + offset % 97)


def main() -> None:
    system = FileChangelogSystem({"segment_bytes": sys.argv[2], "fsync": True}, Path(sys.argv[1]))
    part = system.partition("crash", 0)
    print(part.end_offset(), flush=True)
    batch = int(sys.argv[3])
    while True:
        start = part.end_offset()
        part.append_many(record(o) for o in range(start, start + batch))
        print(part.flush(), flush=True)


if __name__ == "__main__":
    main()
