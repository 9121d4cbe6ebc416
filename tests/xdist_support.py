"""Helpers of tests/conftest.py for running the suite on pytest-xdist workers, free of side effects
on import (tests/test_xdist_support.py tests them): the order in which the controller queues the
work, and the sweep that kills the processes a test session left behind."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any, Mapping, Sequence, TypeVar

__all__ = ["queue_in_order", "environment_of", "kill_processes_carrying", "group_name"]

Unit = TypeVar("Unit", bound=tuple)


def queue_in_order(units: Sequence[Unit], positions: Mapping[str, float]) -> list[Unit]:
    """``units`` (``(scope, tests)`` pairs, in queue order) with each scope named in ``positions``
    moved to that fraction of the other units (0.0: first, 1.0: last; scopes at the same position in
    the order ``positions`` names them); the rest keep their order."""
    rank = {scope: index for index, scope in enumerate(positions)}
    rest = [unit for unit in units if unit[0] not in positions]
    placed = sorted((unit for unit in units if unit[0] in positions),
                    key=lambda unit: (positions[unit[0]], rank[unit[0]]))
    slots = [round(positions[unit[0]] * len(rest)) for unit in placed]
    for unit, slot in reversed(list(zip(placed, slots))):  # from the back: earlier slots stay valid
        rest.insert(slot, unit)
    return rest


def environment_of(pid: int) -> dict[str, str]:
    """The environment process ``pid`` started with ({} if it is gone or not ours to read)."""
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    pairs = (entry.decode(errors="replace").partition("=") for entry in raw.split(b"\0") if b"=" in entry)
    return {name: value for name, _, value in pairs}


def kill_processes_carrying(tokens: Mapping[str, str], *, spare: Sequence[int] = ()) -> list[int]:
    """SIGKILL every process (but this one and ``spare``) whose environment has one of ``tokens``
    (name -> value): the processes a test session started, wherever they moved (their own process
    group or session, reparented to init). Returns their pids."""
    keep = {os.getpid(), *spare}
    killed = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) in keep:
            continue
        environment = environment_of(int(entry.name))
        if any(environment.get(name) == value for name, value in tokens.items()):
            try:
                os.kill(int(entry.name), signal.SIGKILL)
                killed.append(int(entry.name))
            except ProcessLookupError:
                pass
    return killed


def group_name(mark: Any) -> str:
    """The group an ``xdist_group`` mark names (xdist's default name if none)."""
    return str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))
