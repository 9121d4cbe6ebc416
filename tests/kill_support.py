"""The kill-and-restart loop of the tests that SIGKILL a child job at named crash points."""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Callable
from pathlib import Path

ChildRun = Callable[[Path, "str | None"], subprocess.CompletedProcess]


def run_through_kills(run_child: ChildRun, state: Path, crashes: list[str]) -> None:
    """Run the child on ``state`` once per crash point in ``crashes`` (each run must die by SIGKILL
    there), then once more without one, which must finish (exit 0, printing "done")."""
    for crash in crashes:
        killed = run_child(state, crash)
        assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    finished = run_child(state, None)
    assert finished.returncode == 0 and "done" in finished.stdout, finished.stderr[-3000:]
