"""The one fault injector (runtime/partition/faults.py): a crash point armed for a block, kill-once markers."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

from localstate.runtime.partition.faults import CrashAt, armed, crash_point

SCRIPT = """
import sys
from localstate.runtime.partition.faults import CrashAt, armed, crash_point
with armed(CrashAt.after_records(2, marker=sys.argv[1])):
    for _ in range(5):
        crash_point("process")
print("survived")
"""


def run(marker: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", SCRIPT, str(marker)], capture_output=True, text=True, timeout=60)


def test_an_armed_point_kills_once_then_the_marker_lets_the_retry_through(tmp_path: Path) -> None:
    marker = tmp_path / "killed"
    first = run(marker)
    assert first.returncode == -signal.SIGKILL and "survived" not in first.stdout
    assert marker.read_text().startswith("killed pid ")
    second = run(marker)                                   # the retried attempt
    assert second.returncode == 0 and "survived" in second.stdout


def test_arming_is_scoped_to_the_block() -> None:
    with armed(CrashAt("test-only-point", count=10**9)):
        crash_point("test-only-point")                     # far from its count: nothing happens
    with armed(None):
        crash_point("test-only-point")
    crash_point("test-only-point")                         # disarmed again
