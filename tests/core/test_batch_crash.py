"""A batch task SIGKILLed at every commit point (issue #35): the kill -9 harness of
tests/core/test_runtime.py (tests/core/crash_job.py in a child process, crash points armed by
LOCALSTATE_CRASH_AT) with the batch task, fed batches of varying size: after the restarts the state
and the ``running`` output are exactly those of one clean run, and the changelog alone rebuilds the
same state."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
import crash_job  # noqa: E402

RECORDS, COMMIT_EVERY = 1500, 200


def child(state_dir: Path, *args: object, crash: str | None = None) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]))
    env.pop("LOCALSTATE_CRASH_AT", None)
    if crash:
        env["LOCALSTATE_CRASH_AT"] = crash
    return subprocess.Popen([sys.executable, str(HERE / "crash_job.py"), str(state_dir), *map(str, args), "batch"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def dump(state_dir: Path, out: Path) -> tuple[dict, int, list]:
    proc = child(state_dir, "dump", out)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    data = json.loads(out.read_text())
    return {name: sorted(data[name]) for name in ("per_key", "per_bucket")}, data["position"], data["running"]


def expected() -> tuple[dict, list]:
    per_key, per_bucket = crash_job.expected_state(RECORDS)
    state = {"per_key": sorted(map(list, per_key.items())), "per_bucket": sorted(map(list, per_bucket.items()))}
    return state, crash_job.expected_outputs(RECORDS)


# Every point of the commit protocol, early and late in the run; "process" is reached once per row.
# The default run kills once at each point (late in the run: there is committed state to come back
# to); the earlier and other kills at the same points are the slow soak (`-m slow`).
SOAK = pytest.mark.slow
POINTS = [pytest.param("process", 1, marks=SOAK), ("process", 377), pytest.param("process", 1203, marks=SOAK),
          pytest.param("mid_flush", 1, marks=SOAK), ("mid_flush", 4), pytest.param("after_flush", 1, marks=SOAK),
          ("after_flush", 6), pytest.param("after_checkpoint", 1, marks=SOAK), ("after_checkpoint", 5)]


@pytest.mark.parametrize("point,count", POINTS)
def test_a_batch_task_killed_at_a_commit_point_restarts_to_exact_state_and_outputs(tmp_path: Path, point: str,
                                                                                   count: int) -> None:
    state = tmp_path / "state"
    proc = child(state, "run", RECORDS, COMMIT_EVERY, crash=f"{point}:{count}")
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == -signal.SIGKILL, err
    # killed again at the same point of the rerun (its count restarts), then run to the end
    proc = child(state, "run", RECORDS, COMMIT_EVERY, crash=f"{point}:{count + 1}")
    proc.communicate(timeout=120)
    proc = child(state, "run", RECORDS, COMMIT_EVERY)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0 and "done" in out, err
    want_state, want_outputs = expected()
    got_state, position, running = dump(state, tmp_path / "a.json")
    assert position == RECORDS
    assert got_state == want_state
    assert running == want_outputs  # every row's output once, in order, whatever was killed
    shutil.rmtree(state / "crash" / "stores")  # the changelog alone restores the same state
    rebuilt, _, _ = dump(state, tmp_path / "b.json")
    assert rebuilt == want_state
