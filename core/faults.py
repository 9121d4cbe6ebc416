"""Fault injection for crash tests: ``LOCALSTATE_CRASH_AT="point:n"`` makes the process SIGKILL
itself the n-th time it reaches ``point`` (1-based). Points: ``process``, ``after_flush``
(stores flushed, checkpoint not yet written), ``mid_flush`` (some stores flushed), ``after_checkpoint``.

The hook is a test tool and must never kill a production run: it is honoured only when the
test-only switch ``LOCALSTATE_TESTING=1`` is set as well (``tests/conftest.py`` sets it, and the
tests' child processes inherit it). Without the switch a stray ``LOCALSTATE_CRASH_AT`` is ignored
with a warning; :func:`crash_point` is then a dictionary lookup and a return."""

from __future__ import annotations

import logging
import os
import signal
from typing import Mapping

__all__ = ["crash_point", "TESTING_SWITCH", "CRASH_SPEC", "parse_crash_spec"]

CRASH_SPEC = "LOCALSTATE_CRASH_AT"
TESTING_SWITCH = "LOCALSTATE_TESTING"

log = logging.getLogger(__name__)


def parse_crash_spec(environ: Mapping[str, str]) -> dict[str, int]:
    """The crash points armed by ``environ``: empty unless both the spec and the test switch are set
    and the spec is well formed (a malformed spec is ignored with a warning, never a crash)."""
    spec = environ.get(CRASH_SPEC, "")
    if not spec:
        return {}
    if environ.get(TESTING_SWITCH) != "1":
        log.warning("%s=%r ignored: fault injection needs the test-only switch %s=1", CRASH_SPEC, spec,
                    TESTING_SWITCH)
        return {}
    point, _, count = spec.partition(":")
    try:
        remaining = int(count or 1)
    except ValueError:
        log.warning("%s=%r ignored: expected 'point:n'", CRASH_SPEC, spec)
        return {}
    return {point: remaining} if point else {}


_remaining = parse_crash_spec(os.environ)


def crash_point(point: str) -> None:
    """SIGKILL this process if the crash spec names ``point`` and its count is reached."""
    if point in _remaining:
        _remaining[point] -= 1
        if _remaining[point] <= 0:
            os.kill(os.getpid(), signal.SIGKILL)
