"""Changing a store's backend (rocksdb <-> lmdb <-> memory) needs no savepoint: the changelog is the
truth. At the next start the local state of the other backend is discarded and the store rebuilt from
its changelog, exactly; every engine kind on a backend (kv, kv with ttl, heap, sketch) and the timer
store alike."""

from __future__ import annotations

from pathlib import Path

import pytest

from localstate.testing.driver import TaskTestDriver

from rescale_model import ModelTask, committed_state


def backend_job(root: Path, backend: str):
    from rescale_model import model_job
    return model_job(root, 2, backend=backend)


@pytest.mark.parametrize("sequence", [("rocksdb", "lmdb", "memory", "rocksdb"), ("memory", "lmdb", "rocksdb", "memory")])
def test_a_backend_change_rebuilds_local_state_from_the_changelog_exactly(tmp_path: Path, sequence) -> None:
    records = [(f"user-{i % 11}", i, float(i % 97)) for i in range(120)]
    seen: list[dict] = []
    now = 0.0
    for step, backend in enumerate(sequence):
        job = backend_job(tmp_path, backend)
        driver = TaskTestDriver(ModelTask, job=job)
        driver.now = now
        # what a task reads is the committed state, whatever backend held it before
        expected_counts = {}
        for key, _, _ in records[:30 * step]:
            expected_counts[key] = expected_counts.get(key, 0) + 1
        for key, count in expected_counts.items():
            from localstate.core.partitioner import partition_for
            assert driver.store("counts", partition_for(key, 2)).get(key) == count
        for key, value, timestamp in records[30 * step:30 * (step + 1)]:
            driver.send("events", key, value, timestamp=timestamp)
            driver.advance(1.0)
        now = driver.now
        driver.close()
        seen.append(committed_state(job, now))
    # the committed state after the last step is that of one backend all along
    reference = tmp_path / "reference"
    job = backend_job(reference, sequence[-1])
    driver = TaskTestDriver(ModelTask, job=job)
    for key, value, timestamp in records[:30 * len(sequence)]:
        driver.send("events", key, value, timestamp=timestamp)
        driver.advance(1.0)
    driver.close()
    assert seen[-1] == committed_state(job, now)
