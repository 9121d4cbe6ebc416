"""Kill -9 tests of timers: SIGKILL the job at every commit-protocol point and at the firing points,
with timers pending and firing; after restarts each timer has fired exactly once, in the order an
uninterrupted run fires them, with exact outputs (file outputs are exactly once)."""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from kill_support import run_through_kills
from localstate.streams.jsonl import read_jsonl

sys.path.insert(0, str(Path(__file__).resolve().parent))
from timer_crash_job import LATENESS, clock_at, input_record  # noqa: E402

CHILD = Path(__file__).resolve().parent / "timer_crash_job.py"
RECORDS, COMMIT_EVERY = 160, 20


def model(records: int, commit_every: int) -> list[tuple[str, list[float]]]:
    """Plain Python: the outputs of an uninterrupted run (timers fire at each commit, every
    ``commit_every`` records, and at close: event time, then processing time, each in (timestamp,
    key) order)."""
    timers: set[tuple[float, str]] = set()
    processing: set[tuple[float, str]] = set()
    counts: dict[str, int] = {}
    out: list[tuple[str, list[float]]] = []
    high = -math.inf

    def fire(position: int) -> None:
        watermark = high - LATENESS
        while timers and min(timers)[0] <= watermark:
            ts, key = min(timers)
            timers.discard((ts, key))
            out.append((key, [ts, counts.get(key)]))
            if key.endswith("0") and ts == int(ts):
                timers.add((ts + 1.5, key))
        now = clock_at(position)
        while processing and min(processing)[0] <= now:
            ts, key = min(processing)
            processing.discard((ts, key))
            out.append((key, [ts, "processing"]))

    for i in range(records):
        key, ts = input_record(i)
        counts[key] = counts.get(key, 0) + 1
        high = max(high, ts)
        timers.add((ts + 5, key))
        if i % 5 == 0:
            processing.add((clock_at(i) + 3, key))
        if i % 4 == 3:
            previous_key, previous_ts = input_record(i - 1)
            timers.discard((previous_ts + 5, previous_key))
        if (i + 1) % commit_every == 0:
            fire(i + 1)
    fire(records)
    return out


def run_child(state: Path, crash: str | None, changelog: str = "file") -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env.pop("LOCALSTATE_CRASH_AT", None)
    if crash is not None:
        env["LOCALSTATE_CRASH_AT"] = crash
    return subprocess.run([sys.executable, str(CHILD), str(state), str(RECORDS), str(COMMIT_EVERY), changelog], env=env,
                          capture_output=True, text=True, timeout=300)


def outputs(state: Path) -> list[tuple[str, list[float]]]:
    return [(r["key"], r["value"]) for r in read_jsonl(state / "fired", 0)]


def test_the_model_fires_timers_pending_across_commits_and_while_firing() -> None:
    fired = model(RECORDS, COMMIT_EVERY)
    assert len(fired) > 100
    assert any(ts != int(ts) for _, (ts, _) in fired)          # timers registered while firing
    assert len({(key, ts, kind == "processing") for key, (ts, kind) in fired}) == len(fired)
    assert 20 < sum(kind == "processing" for _, (_, kind) in fired) < RECORDS // 5  # the last ones stay pending


# Each crash point once in the default run; a second firing kill and three kills in a row are the
# slow soak (`-m slow`).
@pytest.mark.parametrize("crashes", [
    ["process:57"], ["timer_fire:1"], pytest.param(["timer_fire:9"], marks=pytest.mark.slow), ["after_timers:2"],
    ["mid_flush:3"], ["after_flush:3"], ["after_checkpoint:3"],
    pytest.param(["timer_fire:30", "after_flush:2", "timer_fire:5"], marks=pytest.mark.slow),
])
def test_each_timer_fires_exactly_once_across_kills(tmp_path: Path, crashes: list[str]) -> None:
    state = tmp_path / "state"
    run_through_kills(run_child, state, crashes)
    assert outputs(state) == [(key, list(value)) for key, value in model(RECORDS, COMMIT_EVERY)]


def test_an_uninterrupted_run_matches_the_model(tmp_path: Path) -> None:
    finished = run_child(tmp_path / "state", None)
    assert finished.returncode == 0, finished.stderr[-3000:]
    assert outputs(tmp_path / "state") == [(key, list(value)) for key, value in model(RECORDS, COMMIT_EVERY)]


@pytest.mark.parametrize("crashes", [["commit_pending:3"],
                                     pytest.param(["timer_fire:12", "commit_pending:2"], marks=pytest.mark.slow)])
def test_each_timer_fires_exactly_once_across_kills_with_pipelined_commits(tmp_path: Path, crashes: list[str]) -> None:
    """The objectstore changelog: commits are pipelined, and a kill between a commit's writes and its
    checkpoint (``commit_pending``, on the committer thread) rolls the firings of that commit back."""
    state = tmp_path / "state"
    for crash in crashes:
        killed = run_child(state, crash, "objectstore")
        assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    finished = run_child(state, None, "objectstore")
    assert finished.returncode == 0 and "done" in finished.stdout, finished.stderr[-3000:]
    assert outputs(state) == [(key, list(value)) for key, value in model(RECORDS, COMMIT_EVERY)]
