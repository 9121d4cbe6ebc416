"""A Structured Streaming query through the DataFrame entry point (file source, kv and heap stores):
a Python worker SIGKILLed mid-batch, the driver SIGKILLed twice (after the sink wrote a batch, and
between two partitions' checkpoint saves) and restarted from its checkpointLocation. The final
state and the sink contents are exact against plain Python: no duplicates, no losses, and every
re-executed batch produced the same rows."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from dataframe_tasks import expected_outputs, job_config, read_state  # noqa: E402

DRIVER = Path(__file__).resolve().parent / "dataframe_stream_driver.py"
pytestmark = pytest.mark.spark


def _write_inputs(directory: Path, batches: list[list[dict]]) -> None:
    directory.mkdir()
    for index, batch in enumerate(batches):
        path = directory / f"events-{index:03d}.json"
        path.write_text("".join(json.dumps(row) + "\n" for row in batch))
        os.utime(path, (1_700_000_000 + index, 1_700_000_000 + index))  # the file source takes them by age


def _sink_rows(sink: Path) -> dict[int, list[tuple]]:
    """Rows per batch; asserts every attempt of a batch wrote the same rows."""
    import pyarrow.parquet as pq

    per_batch = {}
    for batch_dir in sorted(sink.iterdir()):
        batch_id = int(batch_dir.name.split("=")[1])
        attempts = [sorted(tuple(row.values()) for row in pq.read_table(attempt).to_pylist())
                    for attempt in sorted(batch_dir.iterdir())]
        assert all(rows == attempts[0] for rows in attempts), f"batch {batch_id} attempts differ"
        per_batch[batch_id] = attempts[0]
    return per_batch


# slow: killed workers, restarted queries and replayed batches of the DataFrame step run in the default
# run (tests/spark/test_dataframe_kept_instances.py); this is the soak with a real query's driver killed.
@pytest.mark.slow
def test_streaming_query_survives_worker_and_driver_kills(tmp_path):
    rng = random.Random(7)
    sizes = [40, 30, 50, 35]  # batch 3 is the last fault's; small batches: the three driver starts dominate
    stamps = iter(rng.sample(range(10**6), sum(sizes)))
    batches = [[{"user": f"user-{rng.randrange(25)}", "page": f"/p/{rng.randrange(5)}", "ts": next(stamps)}
                for _ in range(size)] for size in sizes]
    _write_inputs(tmp_path / "input", batches)
    markers = tmp_path / "markers"
    markers.mkdir()
    paths = [str(tmp_path / name) for name in ("input", "query-checkpoint", "sink", "state")] + [str(markers)]
    env = {**os.environ, "LOCALSTATE_TESTING": "1"}
    codes = []
    for _ in range(4):
        done = subprocess.run([sys.executable, str(DRIVER), *paths], env=env, capture_output=True, text=True,
                              timeout=600)
        codes.append(done.returncode)
        if done.returncode == 0:
            break
        assert done.returncode == -9, done.stderr[-3000:]
    assert codes == [-9, -9, 0]
    assert sorted(p.name for p in markers.iterdir()) == ["driver-after-sink", "driver-partial-commit",
                                                         "worker-killed"]

    counts, expected = expected_outputs(batches)
    per_batch = _sink_rows(tmp_path / "sink")
    assert sorted(per_batch) == list(range(len(batches)))
    got = []
    for batch_id, rows in per_batch.items():
        for partition, row_batch, seq, stream, key, value in rows:
            count, page, ts = json.loads(value)
            assert row_batch == batch_id and stream == "counts"
            got.append((batch_id, json.loads(key), count, page))
    assert sorted(got) == sorted(expected)  # exact: no duplicates, no losses, each batch in its place
    assert len(got) == sum(sizes)

    state_counts, scores = read_state(job_config(tmp_path / "state"))
    assert state_counts == counts
    assert scores == {user: float(count) for user, count in counts.items()}
