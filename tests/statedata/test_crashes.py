"""SIGKILL at every step of a savepoint, a start from a savepoint and a rescale (from the committed
state read in place, or by a kept savepoint): afterwards the job has either its old state, intact and
runnable, or the complete new one, never a mix; a savepoint cut short is never read as whole; running
the step again completes it."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from localstate.errors import SavepointCorruptError
from localstate.runtime.layout import read_epoch
from localstate.runtime.statedata.location import SavepointLocation
from localstate.runtime.statedata.reader import Savepoint
from localstate.runtime.statedata.rescale import rescale
from localstate.runtime.layout import resolve_epoch

from rescale_model import ModelRun, committed_state, model_job

TESTS = Path(__file__).resolve().parents[1]
CHILD = TESTS / "statedata_crash.py"
RECORDS = [(f"user-{i % 13}", i, float(i % 90)) for i in range(60)]
STORES = 9  # the model job's logged stores, the timer store included


def child(*args: str, crash: str | None = None) -> int:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    if crash:
        env["LOCALSTATE_CRASH_AT"] = crash
    return subprocess.run([sys.executable, str(CHILD), *args], env=env, timeout=600).returncode


@pytest.fixture(scope="module")
def original(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict, float, dict]:
    """The model job run on 2 partitions; its state; and the state a clean rescale to 3 gives."""
    root = tmp_path_factory.mktemp("original")
    run = ModelRun(model_job(root, 2))
    run.feed(RECORDS)
    now = run.close()
    clean = tmp_path_factory.mktemp("clean")
    shutil.copytree(root, clean, dirs_exist_ok=True)
    rescale(resolve_epoch(model_job(clean, 2)), 3)
    return root, committed_state(model_job(root, 2), now), now, committed_state(model_job(clean, 3), now)


def copy_of(original: Path, tmp_path: Path) -> Path:
    root = tmp_path / "job"
    shutil.copytree(original, root)
    return root


def old_or_new(root: Path, before: dict, after: dict, now: float) -> int:
    """The job's state is the old one (epoch 0) or the complete new one. Returns the epoch."""
    epoch = read_epoch(model_job(root, 2)).epoch
    partitions = 2 if epoch == 0 else 3
    assert committed_state(model_job(root, partitions), now) == (before if epoch == 0 else after)
    return epoch


def runs_on(root: Path, partitions: int, now: float) -> None:
    run = ModelRun(model_job(root, partitions), now=now)
    run.feed(RECORDS[:5])
    run.close()


@pytest.mark.parametrize("crash", ["savepoint_file:2", "savepoint_manifest:1"])
def test_a_savepoint_killed_midway_is_never_read_as_whole(original, tmp_path: Path, crash: str) -> None:
    source, before, now, _ = original
    root = copy_of(source, tmp_path)
    where = tmp_path / "sp"
    assert child("savepoint", str(root), str(where), crash=crash) == -signal.SIGKILL
    with pytest.raises(SavepointCorruptError, match="cut short"):
        Savepoint.open(SavepointLocation({"url": str(where)}))
    old_or_new(root, before, before, now)  # the job is untouched
    runs_on(root, 2, now)
    again = tmp_path / "sp2"
    assert child("savepoint", str(root), str(again)) == 0
    Savepoint.open(SavepointLocation({"url": str(again)}))


STEPS = ["epoch_reserved:1", f"epoch_store:{STORES // 2}", "epoch_checkpoints:1", "epoch_flipped:1"]
"""Every step of a start from a savepoint: the epoch number reserved, stores written (some), the
checkpoints written, the pointer switched (the first store's and the last's are the same step)."""


@pytest.mark.parametrize("crash", STEPS)
def test_a_start_from_a_savepoint_killed_midway_leaves_the_old_state_or_the_new_one(original, tmp_path: Path,
                                                                                    crash: str) -> None:
    source, before, now, after = original
    root = copy_of(source, tmp_path)
    where = tmp_path / "sp"
    assert child("savepoint", str(root), str(where)) == 0
    assert child("load", str(root), str(where), crash=crash) == -signal.SIGKILL
    epoch = old_or_new(root, before, after, now)
    assert epoch == (1 if crash.startswith("epoch_flipped") else 0)
    if epoch == 0:  # and the start completes when run again (with a fresh epoch number)
        assert child("load", str(root), str(where)) == 0
        assert committed_state(model_job(root, 3), now) == after
    runs_on(root, 3, now)


# A rescale reads the committed state in place and starts from it: its steps are a start's (above),
# each killed here too (the first store's and the last's; the shared ones beyond the first and last
# store are the slow soak). Nothing is written before the epoch is reserved.
RESCALE_STEPS = [pytest.param("epoch_reserved:1", marks=pytest.mark.slow), "epoch_store:1", f"epoch_store:{STORES}",
                 pytest.param("epoch_checkpoints:1", marks=pytest.mark.slow), "epoch_flipped:1"]


@pytest.mark.parametrize("crash", RESCALE_STEPS)
def test_a_rescale_killed_midway_leaves_the_old_state_or_the_new_one(original, tmp_path: Path, crash: str) -> None:
    source, before, now, after = original
    root = copy_of(source, tmp_path)
    assert child("rescale", str(root), crash=crash) == -signal.SIGKILL
    epoch = old_or_new(root, before, after, now)
    assert epoch == (1 if crash.startswith("epoch_flipped") else 0)
    if epoch == 0:  # the dead rescale's instance locks went with its process: it runs again
        assert child("rescale", str(root)) == 0
        assert committed_state(model_job(root, 3), now) == after
    runs_on(root, 3, now)


# With --savepoint PATH a rescale takes a savepoint first (kept): killed while it is written, the job
# is untouched and the savepoint cut short is never read; the start's steps are those above.
@pytest.mark.slow
@pytest.mark.parametrize("crash", ["savepoint_file:1", "savepoint_manifest:1"])
def test_a_rescale_by_a_kept_savepoint_killed_while_it_is_taken_leaves_the_old_state(original, tmp_path: Path,
                                                                                      crash: str) -> None:
    source, before, now, after = original
    root = copy_of(source, tmp_path)
    kept = tmp_path / "kept"
    assert child("rescale", str(root), str(kept), crash=crash) == -signal.SIGKILL
    assert old_or_new(root, before, after, now) == 0
    with pytest.raises(SavepointCorruptError, match="cut short"):
        Savepoint.open(SavepointLocation({"url": str(kept)}))
    assert child("rescale", str(root), str(tmp_path / "kept-again")) == 0
    assert committed_state(model_job(root, 3), now) == after
