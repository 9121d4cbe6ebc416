"""Fault injection for crash tests: the one mechanism is the *crash point*. Code that must survive a
crash calls :func:`crash_point` at the moments a process could die: ``process`` (before each input
record is fed, good or bad), ``timer_fire`` (before each timer fires), ``after_timers`` (after a
round of firings), ``mid_flush`` (some stores flushed), ``after_flush`` (stores flushed, checkpoint
not yet written), ``after_outputs`` (a commit's outputs delivered, transactions open), ``commit_pending`` (a pipelined commit's objects written, its
checkpoint not yet saved; reached on the committer thread), ``after_checkpoint``, and on the Spark
driver ``driver_commit`` (a batch's tasks prepared its commit, the driver has not saved its
checkpoints yet) and ``driver_saved`` (a partition's checkpoint saved, the output transactions it
names not committed yet). An *armed* point SIGKILLs this process the n-th time it is reached (1-based), or,
with the action ``stop``, SIGSTOPs it there: a test then signals it in the middle of that moment
and continues it (SIGCONT).

Points are armed two ways, both as a :class:`CrashAt`:

* by the environment, ``LOCALSTATE_CRASH_AT="point:n"`` (or ``"point:n:stop"``), honoured only when the test-only switch
  ``LOCALSTATE_TESTING=1`` is set as well (``tests/conftest.py`` sets it, and the tests' child
  processes inherit it): a stray ``LOCALSTATE_CRASH_AT`` never kills a production run, it is ignored
  with a warning;
* explicitly, for the extent of a ``with armed(CrashAt(...)):`` block: how the Spark runner kills one
  worker in one batch (``SparkJobRunner(fault=...)``, the demo's ``--kill``). Such a point usually
  carries a ``marker`` file: it fires only if the marker does not exist yet and creates it before
  dying, so the retried attempt runs through ("kill once").

Unarmed, :func:`crash_point` is a dictionary lookup and a return (it sits on the per-record path)."""

from __future__ import annotations

import logging
import os
import signal
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Mapping

__all__ = ["crash_point", "crash_points", "is_armed", "CrashAt", "armed", "TESTING_SWITCH", "CRASH_SPEC",
           "parse_crash_spec"]

CRASH_SPEC = "LOCALSTATE_CRASH_AT"
TESTING_SWITCH = "LOCALSTATE_TESTING"

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CrashAt:
    """Kill this process the ``count``-th time ``point`` is reached; with ``marker``, only if that
    file does not exist yet (it is written just before the kill, naming the pid)."""

    point: str
    count: int = 1
    marker: str | None = None
    action: str = "kill"
    """``kill`` (SIGKILL) or ``stop`` (SIGSTOP: the process waits there for SIGCONT)"""

    @classmethod
    def after_records(cls, records: int, marker: str | None = None) -> "CrashAt":
        """Die after ``records`` input records were fed (just before the next one)."""
        return cls("process", records + 1, marker)

    @classmethod
    def from_plan_fault(cls, fault: Mapping[str, Any]) -> "CrashAt":
        """The point a Spark plan's ``{"partition", "batch", "after", "marker"}`` fault arms: die after
        ``after`` records, or, with ``"point": "timer_fire"``, after ``after`` timers fired."""
        point = fault.get("point", "process")
        return cls(point, int(fault["after"]) + 1, fault.get("marker"))


class _Armed:
    """A point's remaining count and marker, while armed."""

    __slots__ = ("remaining", "marker", "signal")

    def __init__(self, spec: CrashAt) -> None:
        self.remaining = spec.count
        self.marker = spec.marker
        self.signal = signal.SIGSTOP if spec.action == "stop" else signal.SIGKILL

    def reached(self) -> None:
        self.remaining -= 1
        if self.remaining > 0:
            return
        if self.marker is not None:
            marker = Path(self.marker)
            if marker.exists():
                return
            marker.write_text(f"killed pid {os.getpid()}\n")
        os.kill(os.getpid(), self.signal)


def parse_crash_spec(environ: Mapping[str, str]) -> dict[str, CrashAt]:
    """The crash points armed by ``environ``: empty unless both the spec and the test switch are set
    and the spec is well formed (a malformed spec is ignored with a warning, never a crash)."""
    spec = environ.get(CRASH_SPEC, "")
    if not spec:
        return {}
    if environ.get(TESTING_SWITCH) != "1":
        log.warning("%s=%r ignored: fault injection needs the test-only switch %s=1", CRASH_SPEC, spec,
                    TESTING_SWITCH)
        return {}
    point, _, rest = spec.partition(":")
    count, _, action = rest.partition(":")
    try:
        remaining = int(count or 1)
    except ValueError:
        remaining = None
    if remaining is None or action not in ("", "kill", "stop"):
        log.warning("%s=%r ignored: expected 'point:n' or 'point:n:stop'", CRASH_SPEC, spec)
        return {}
    return {point: CrashAt(point, remaining, action=action or "kill")} if point else {}


_armed: dict[str, _Armed] = {point: _Armed(spec) for point, spec in parse_crash_spec(os.environ).items()}


def crash_point(point: str) -> None:
    """SIGKILL this process if ``point`` is armed and its count is reached."""
    if point in _armed:
        _armed[point].reached()


def is_armed(point: str) -> bool:
    """Whether ``point`` is armed now (a loop may then skip calling :func:`crash_point` per item)."""
    return point in _armed


def crash_points(point: str, times: int) -> None:
    """:func:`crash_point` ``times`` times (a batch of records reaching ``process`` one by one)."""
    if point in _armed:
        reached = _armed[point].reached
        for _ in range(times):
            reached()


@contextmanager
def armed(spec: CrashAt | None) -> Iterator[None]:
    """Arm ``spec`` for the extent of the block (``None``: arm nothing). What was armed at this point
    before (by the environment) is restored afterwards: Spark reuses its Python workers."""
    if spec is None:
        yield
        return
    before = _armed.get(spec.point)
    _armed[spec.point] = _Armed(spec)
    try:
        yield
    finally:
        if before is None:
            _armed.pop(spec.point, None)
        else:
            _armed[spec.point] = before
