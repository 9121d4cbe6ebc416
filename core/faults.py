"""Fault injection for crash tests: ``LOCALSTATE_CRASH_AT="point:n"`` makes the process SIGKILL
itself the n-th time it reaches ``point`` (1-based). Points: ``process``, ``after_flush``
(stores flushed, checkpoint not yet written), ``mid_flush`` (some stores flushed), ``after_checkpoint``.
Unset in production, where :func:`crash_point` is a dictionary lookup and a return."""

from __future__ import annotations

import os
import signal

__all__ = ["crash_point"]

_SPEC = os.environ.get("LOCALSTATE_CRASH_AT", "")
_POINT, _, _COUNT = _SPEC.partition(":")
_remaining = {_POINT: int(_COUNT or 1)} if _POINT else {}


def crash_point(point: str) -> None:
    """SIGKILL this process if the crash spec names ``point`` and its count is reached."""
    if point in _remaining:
        _remaining[point] -= 1
        if _remaining[point] <= 0:
            os.kill(os.getpid(), signal.SIGKILL)
