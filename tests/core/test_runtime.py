"""The commit protocol: exactly-once state across crashes, trim, fencing, and the clear errors of
missing or inconsistent checkpoints. Uses the kv engine and the file changelog."""

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from localstate.runtime.layout import checkpoint_store, open_changelog_system, store_directory
from localstate.runtime.partition.instance import TaskInstance
from localstate.core.task import StreamTask
from localstate.testing.driver import TaskTestDriver
from localstate.errors import CheckpointError, FencedError, TaskError

HERE = Path(__file__).parent
COUNTS = {"counts": {"engine": "kv", "backend": "rocksdb", "key_serde": "string", "value_serde": "int"}}


class Counter(StreamTask):
    def init(self, context):
        self.counts = context.store("counts")

    def process(self, envelope, collector, coordinator):
        if envelope.value == "boom":
            raise ValueError("bad record")
        count = (self.counts.get(envelope.key) or 0) + 1
        self.counts.put(envelope.key, count)
        collector.send("counted", envelope.key, count)


def snapshot(driver, partition=0):
    return dict(driver.store("counts", partition).all())


def test_crash_loses_only_uncommitted_work_and_replays_its_inputs(tmp_path):
    with TaskTestDriver(Counter, stores=COUNTS, state_dir=tmp_path, partitions=2) as driver:
        for i in range(200):
            driver.send("views", f"u{i % 10}", i)
        driver.commit()
        committed_outputs = driver.outputs("counted")
        for i in range(200, 260):
            driver.send("views", f"u{i % 10}", i)
        driver.crash()
        driver.restart()
        merged = {**snapshot(driver, 0), **snapshot(driver, 1)}
        assert merged == {f"u{k}": 26 for k in range(10)}
        driver.commit()
        outputs = driver.outputs("counted")
        assert set(committed_outputs) <= set(outputs)
        # Uncommitted outputs were rolled back, then produced once: no (key, count) twice.
        assert len(outputs) == len(set(outputs)) == 260


def crash_after_flush_and_restart(driver):
    """Commit a, a, b; flush a, c without a checkpoint; crash, drop the uncommitted input, restart."""
    for key in "aab":
        driver.send("views", key, 0)
    driver.commit()
    driver.send("views", "a", 0)
    driver.send("views", "c", 0)
    driver.instances[0].prepare_commit()  # the changelog and local state hold a=3, c=1 ...
    driver.crash()                          # ... but no checkpoint says so
    # Lose the input that was not committed too: state must be exactly the checkpoint.
    driver.inputs[("views", 0)] = driver.inputs[("views", 0)][:3]
    return driver.restart()


def test_crash_between_changelog_flush_and_checkpoint_is_trimmed(tmp_path):
    with TaskTestDriver(Counter, stores=COUNTS, state_dir=tmp_path) as driver:
        recoveries = crash_after_flush_and_restart(driver)
        assert recoveries[0].trimmed == 2
        assert snapshot(driver) == {"a": 2, "b": 1}
        # A restore from the changelog alone (local state deleted) cannot see the trimmed values.
        driver.crash()
        shutil.rmtree(store_directory(driver.job, "counts", 0))
        recoveries = driver.restart()
        assert recoveries[0].local_offset is None
        assert snapshot(driver) == {"a": 2, "b": 1}


def test_local_store_deleted_is_rebuilt_from_changelog(tmp_path):
    with TaskTestDriver(Counter, stores=COUNTS, state_dir=tmp_path) as driver:
        for i in range(1000):
            driver.send("views", f"k{i % 37}", i)
        driver.commit()
        before = snapshot(driver)
        driver.crash()
        shutil.rmtree(store_directory(driver.job, "counts", 0))
        driver.restart()
        assert snapshot(driver) == before


def test_clean_restart_needs_no_replay(tmp_path):
    with TaskTestDriver(Counter, stores=COUNTS, state_dir=tmp_path) as driver:
        for i in range(100):
            driver.send("views", f"k{i % 7}", i)
        driver.commit()
        driver.crash()
        recoveries = driver.restart()
        assert recoveries[0].status == "ready" and recoveries[0].replayed == 0


def test_missing_checkpoint_with_nonempty_changelog_is_refused(tmp_path):
    driver = TaskTestDriver(Counter, stores=COUNTS, state_dir=tmp_path)
    driver.send("views", "a", 0)
    driver.commit()
    driver.crash()
    checkpoint_store(driver.job).delete(0)
    with pytest.raises(CheckpointError) as info:
        driver.restart()
    assert "checkpoint is missing" in str(info.value) and "localstate reset" in str(info.value)


def test_checkpoint_without_a_stores_offset_is_refused_when_its_changelog_has_records(tmp_path):
    """Partial checkpoint loss: a checkpoint that names no offset for a logged store whose changelog
    holds records is refused (recovering to offset 0 would trim every committed record), nothing is
    trimmed, and putting the entry back gives the exact state."""
    driver = TaskTestDriver(Counter, stores=COUNTS, state_dir=tmp_path)
    for i in range(50):
        driver.send("views", f"k{i % 7}", i)
    driver.commit()
    before = snapshot(driver)
    driver.crash()
    path = checkpoint_store(driver.job).path(0)
    complete = path.read_text()
    data = json.loads(complete)
    logged = data["changelogs"].pop("counts")
    assert logged == 7  # one record per key: the commit coalesced the 50 updates
    path.write_text(json.dumps(data))
    with pytest.raises(CheckpointError) as info:
        driver.restart()
    error = info.value
    assert error.context["store"] == "counts" and error.context["partition"] == 0
    assert error.context["path"] == str(path) and f"holds {logged} record(s)" in str(error)
    assert "names no changelog offset for store 'counts'" in str(error) and "localstate reset" in error.hint
    assert json.loads(path.read_text()) == data  # refused before a new generation was saved
    path.write_text(complete)
    recoveries = driver.restart()
    assert recoveries[0].trimmed == 0 and snapshot(driver) == before


def test_store_added_to_the_job_starts_empty_beside_the_restored_ones(tmp_path):
    """The legitimate case of a checkpoint without a store's offset: a store new to the job (its
    changelog empty) starts empty, and the stores the checkpoint names are restored."""
    with TaskTestDriver(Counter, stores=COUNTS, state_dir=tmp_path) as driver:
        for i in range(30):
            driver.send("views", f"k{i % 5}", i)
        driver.commit()
        before = snapshot(driver)
    more = {**COUNTS, "extra": {"engine": "kv", "backend": "memory", "key_serde": "string", "value_serde": "int"}}
    with TaskTestDriver(Counter, stores=more, state_dir=tmp_path) as driver:
        assert snapshot(driver) == before
        assert dict(driver.store("extra", 0).all()) == {}
        driver.commit()
        assert set(json.loads(checkpoint_store(driver.job).path(0).read_text())["changelogs"]) == {"counts", "extra"}


def test_checkpoint_past_changelog_end_is_refused(tmp_path):
    driver = TaskTestDriver(Counter, stores=COUNTS, state_dir=tmp_path)
    driver.send("views", "a", 0)
    driver.commit()
    driver.crash()
    path = checkpoint_store(driver.job).path(0)
    data = json.loads(path.read_text())
    data["changelogs"]["counts"] += 1000
    path.write_text(json.dumps(data))
    with pytest.raises(CheckpointError) as info:
        driver.restart()
    assert "missing" in str(info.value) and "store=counts" in str(info.value)


def test_corrupt_checkpoint_is_refused_with_its_path(tmp_path):
    driver = TaskTestDriver(Counter, stores=COUNTS, state_dir=tmp_path)
    driver.send("views", "a", 0)
    driver.commit()
    driver.crash()
    path = checkpoint_store(driver.job).path(0)
    path.write_text(path.read_text()[:-7])
    with pytest.raises(CheckpointError) as info:
        driver.restart()
    assert str(path) in str(info.value)


def test_second_live_instance_is_fenced(tmp_path):
    driver = TaskTestDriver(Counter, stores={"counts": {**COUNTS["counts"], "backend": "memory"}}, state_dir=tmp_path)
    driver.send("views", "a", 0)
    driver.commit()
    second = TaskInstance(driver.job, 0, open_changelog_system(driver.job), task_factory=Counter)
    with pytest.raises(FencedError):
        second.open()
    # A stale instance that lost its lock (e.g. on a shared file system) cannot commit over a newer one.
    stale = driver.instances[0]
    stale.checkpoints.unlock(0)
    for store in stale.stores.values():
        store.changelog.close()
    newer = TaskInstance(driver.job, 0, open_changelog_system(driver.job), task_factory=Counter)
    newer.open()
    assert newer.generation == stale.generation + 1
    with pytest.raises(FencedError):
        stale.save_checkpoint(stale._checkpoint({}))
    newer.close()


def test_task_error_names_the_input_position(tmp_path):
    with TaskTestDriver(Counter, stores=COUNTS, state_dir=tmp_path) as driver:
        driver.send("views", "a", 0)
        with pytest.raises(TaskError) as info:
            driver.send("views", "a", "boom")
        assert "stream=views" in str(info.value) and "offset=1" in str(info.value)


def test_windows_run_on_interval(tmp_path):
    class Windowed(Counter):
        def window(self, collector, coordinator):
            collector.send("totals", "all", sum(v for _, v in self.counts.all()))
            coordinator.commit()

    with TaskTestDriver(Windowed, stores=COUNTS, state_dir=tmp_path, window_interval=60) as driver:
        driver.send("views", "a", 0)
        driver.advance(30)
        assert driver.outputs("totals") == []
        driver.send("views", "b", 0)
        driver.advance(31)
        assert driver.outputs("totals") == [("all", 2)]


# -- real processes, SIGKILL -------------------------------------------------------------------
RECORDS, COMMIT_EVERY = 3000, 250


def expected_state():
    sys.path.insert(0, str(HERE))
    import crash_job

    per_key, per_bucket = crash_job.expected_state(RECORDS)
    return {"per_key": sorted(map(list, per_key.items())), "per_bucket": sorted(map(list, per_bucket.items()))}


def child(state_dir, *args, crash=None):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]))
    env.pop("LOCALSTATE_CRASH_AT", None)
    if crash:
        env["LOCALSTATE_CRASH_AT"] = crash
    return subprocess.Popen([sys.executable, str(HERE / "crash_job.py"), str(state_dir), *map(str, args)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def dump(state_dir, out):
    proc = child(state_dir, "dump", out)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    data = json.loads(Path(out).read_text())
    return {name: sorted(data[name]) for name in ("per_key", "per_bucket")}, data["position"]


# Every crash point (seed % 4) twice, 16 kills at arbitrary moments: each point once in the default
# run, the second round is the slow soak (`-m slow`).
@pytest.mark.parametrize("seed", [*range(4), *(pytest.param(seed, marks=pytest.mark.slow) for seed in range(4, 8))])
def test_sigkill_at_random_points_gives_exactly_once_state(tmp_path, seed):
    rng = random.Random(seed)
    state = tmp_path / "state"
    point = ["process", "mid_flush", "after_flush", "after_checkpoint"][seed % 4]
    count = rng.randint(1, 8) if point != "process" else rng.randint(1, RECORDS - 1)
    proc = child(state, "run", RECORDS, COMMIT_EVERY, crash=f"{point}:{count}")
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == -signal.SIGKILL, err
    for _ in range(2):  # and kills at arbitrary moments, wherever they land
        proc = child(state, "run", RECORDS, COMMIT_EVERY)
        time.sleep(rng.uniform(0.3, 1.2))
        proc.kill()
        proc.communicate(timeout=120)
    proc = child(state, "run", RECORDS, COMMIT_EVERY)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0 and "done" in out, err
    expected = expected_state()
    state_after, position = dump(state, tmp_path / "a.json")
    assert position == RECORDS
    assert state_after == expected
    # The changelog alone restores the same state.
    shutil.rmtree(state / "crash" / "stores")
    state_rebuilt, _ = dump(state, tmp_path / "b.json")
    assert state_rebuilt == expected
