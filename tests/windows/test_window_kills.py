"""Kill -9 tests of the windows library: SIGKILL the job at every commit-protocol point and at the
timer firing points, with windows open and closing; after restarts every window has been sent
exactly once with exactly the reference model's aggregate, and every late record once."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from kill_support import run_through_kills
from localstate.streams.jsonl import read_jsonl
from localstate.windows import count, sum_of
from localstate.windows.reference import reference_windows, watermarks

sys.path.insert(0, str(Path(__file__).resolve().parent))
from window_crash_job import ALLOWED_LATENESS, SESSIONS, TUMBLING, input_record  # noqa: E402

CHILD = Path(__file__).resolve().parent / "window_crash_job.py"
RECORDS, COMMIT_EVERY = 300, 25


def expected() -> dict[str, Counter]:
    stream = [input_record(i) for i in range(RECORDS)]
    marks = watermarks([ts for *_, ts in stream], ALLOWED_LATENESS)
    rows = [(k, v, ts, w) for (k, v, ts), w in zip(stream, marks)]
    tumbling = reference_windows(rows, TUMBLING, count())
    sessions = reference_windows(rows, SESSIONS, sum_of(), lateness=1.0)
    return {"tumbling": Counter((k, w.start, w.end, n) for k, w, n in tumbling.outputs),
            "sessions": Counter((k, w.start, w.end, n) for k, w, n in sessions.outputs),
            "late": Counter(tumbling.late)}


def sent(state: Path) -> dict[str, Counter]:
    out = {}
    for name in ("tumbling", "sessions"):
        out[name] = Counter((r["key"], r["value"]["start"], r["value"]["end"], r["value"]["value"])
                            for r in read_jsonl(state / name, 0))
    out["late"] = Counter((r["key"], r["value"]) for r in read_jsonl(state / "late", 0))
    return out


def run_child(state: Path, crash: str | None) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env.pop("LOCALSTATE_CRASH_AT", None)
    if crash is not None:
        env["LOCALSTATE_CRASH_AT"] = crash
    return subprocess.run([sys.executable, str(CHILD), str(state), str(RECORDS), str(COMMIT_EVERY)], env=env,
                          capture_output=True, text=True, timeout=300)


def test_the_reference_closes_windows_and_has_late_records() -> None:
    wanted = expected()
    assert len(wanted["tumbling"]) > 50 and len(wanted["sessions"]) > 20 and wanted["late"]


def test_an_uninterrupted_run_matches_the_reference(tmp_path: Path) -> None:
    finished = run_child(tmp_path / "state", None)
    assert finished.returncode == 0, finished.stderr[-3000:]
    assert sent(tmp_path / "state") == expected()


# Each crash point once in the default run; a second firing kill and three kills in a row are the
# slow soak (`-m slow`).
@pytest.mark.parametrize("crashes", [
    ["process:101"], ["timer_fire:1"], pytest.param(["timer_fire:17"], marks=pytest.mark.slow), ["after_timers:3"],
    ["mid_flush:4"], ["after_flush:4"], ["after_checkpoint:5"],
    pytest.param(["timer_fire:12", "after_flush:2", "process:20"], marks=pytest.mark.slow),
])
def test_every_window_is_sent_exactly_once_across_kills(tmp_path: Path, crashes: list[str]) -> None:
    state = tmp_path / "state"
    run_through_kills(run_child, state, crashes)
    assert sent(state) == expected()
