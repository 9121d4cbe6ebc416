"""One background compaction round in a child process: ``python -m localstate.changelog.file.compaction_child``.

A long-running driver compacts every ``compact_interval``. Run on one of its threads, each round
reads whole segments and builds a per-key index of the partition in the driver's heap; the allocator
keeps that high-water mark for the life of the process. In a child, the round's memory goes back to
the operating system when it exits, and its CPU is off the driver's GIL.

The request (JSON on stdin, nothing pickled): the changelog system's validated options and state
directory, and the ``[stream, partition, upto]`` targets. The answer (JSON on stdout): the round's
totals and one entry per target that failed. The child dies with its parent (``PR_SET_PDEATHSIG`` on
Linux, and ``--parent PID``: a parent that died before the signal was armed is noticed); a round
killed half-way is safe, as compaction is (see :mod:`.compaction`).
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import sys
from typing import Any

from localstate.core.changelog import CompactionStats
from localstate.errors import LocalStateError
from .compaction import PARENT_OPTION
from .system import FileChangelogSystem

__all__ = ["run_request"]


def _die_with_parent(parent: int | None) -> None:
    """Arm the parent-death signal, then make sure the parent is still alive: one that died before
    the signal was armed never sends it (the child was adopted by then, so its parent pid changed)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: the round is short and crash-safe anyway
        pass
    if parent is not None and os.getppid() != parent:
        raise SystemExit(f"compaction child: its parent {parent} is gone; nothing compacted")


def _parent(argv: list[str]) -> int | None:
    if len(argv) == 2 and argv[0] == PARENT_OPTION and argv[1].isdigit():
        return int(argv[1])
    return None


def run_request(request: dict[str, Any]) -> dict[str, Any]:
    """Compact every target of ``request`` (see the module docstring); never raises for one target."""
    system = FileChangelogSystem(request["options"], request["state_dir"])
    total = CompactionStats()
    errors = []
    for stream, partition, upto in request["targets"]:
        try:
            total.add(system.compact(stream, int(partition), int(upto), roll=False))
        except (LocalStateError, OSError) as exc:
            errors.append({"stream": stream, "partition": partition, "error": f"{type(exc).__name__}: {exc}"})
    return {"stats": {name: getattr(total, name) for name in CompactionStats.TOTALS}, "errors": errors}


def main() -> int:
    _die_with_parent(_parent(sys.argv[1:]))
    answer = run_request(json.load(sys.stdin))
    json.dump(answer, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
