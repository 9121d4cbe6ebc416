"""``localstate seek``: move a job's checkpointed position in one input on purpose (after the input
was replaced, truncated or re-created). It shows what it would do without ``--yes``, refuses a
partition a live job holds, rewrites the checkpoint atomically through CheckpointStore with the
generation raised (a driver that planned from the old checkpoint is fenced) and writes nothing but
the checkpoints."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from counting_job import write_counting_job  # tests/ is on sys.path (tests/conftest.py)
from localstate.core.checkpoint import Checkpoint
from localstate.core.stream import open_input
from localstate.core.config import load_job_config
from localstate.runtime.layout import checkpoint_store
from localstate.errors import FencedError
from localstate.runtime.spark.driver import SparkJobRunner
from localstate.tools.cli import build_parser, main


def _lines(count: int, prefix: str = "k") -> str:
    return "".join(json.dumps({"key": f"{prefix}{i}", "value": i}) + "\n" for i in range(count))


@pytest.fixture
def shrunk(tmp_path: Path):  # noqa: ANN201
    """A 2-partition job whose checkpoints say 10 lines of each partition were read, and whose input
    files now hold 5 new lines each: ``(job file, job)``."""
    job_file = write_counting_job(tmp_path, "seeking", partitions=2)
    (tmp_path / "data").mkdir()
    job = load_job_config(job_file)
    store = checkpoint_store(job)
    for partition in (0, 1):
        (tmp_path / "data" / f"{partition}.jsonl").write_text(_lines(5, prefix=f"p{partition}-"))
        store.save(Checkpoint(partition, generation=3, inputs={"events": 10}, changelogs={"counts": 7},
                              outputs={"counts-out": 10}))
    return job_file, job


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_without_yes_nothing_moves(shrunk, capsys: pytest.CaptureFixture) -> None:  # noqa: ANN001
    job_file, job = shrunk
    before = _files(job_file.parent)
    assert main(["seek", str(job_file), "--input", "events", "--to-start"]) == 0
    out = capsys.readouterr().out
    assert "partition 0: input 'events' position 10 (outside what the input holds) -> 0 (the input holds offsets 0..5)" \
        in out
    assert "re-run with --yes" in out
    assert _files(job_file.parent) == before


def test_moves_to_start_or_end_with_the_generation_raised(shrunk, capsys: pytest.CaptureFixture) -> None:  # noqa: ANN001
    job_file, job = shrunk
    assert main(["seek", str(job_file), "--input", "events", "--partition", "1", "--to-end", "--yes"]) == 0
    store = checkpoint_store(job)
    moved = store.load(1)
    # only the position, the generation and the identity of the file the position now belongs to changed
    assert moved == Checkpoint(1, generation=4, inputs={"events": 5}, changelogs={"counts": 7},
                               outputs={"counts-out": 10}, input_ids={"events": open_input(job, "events").identity(1)})
    assert moved.input_ids["events"] is not None
    assert store.load(0).inputs == {"events": 10}  # --partition 1 only
    assert main(["seek", str(job_file), "--input", "events", "--to-start", "--yes"]) == 0
    assert store.load(0).inputs == {"events": 0} and store.load(0).generation == 4
    assert store.load(1).inputs == {"events": 0} and store.load(1).generation == 5
    assert "moved to 0" in capsys.readouterr().out
    # the planner now reads what the inputs hold
    plans, lag = SparkJobRunner(job, progress=None).plan(0)
    assert lag == 10 and {p.partition: p.ranges["events"] for p in plans} == {0: (0, 5), 1: (0, 5)}


def test_refuses_a_partition_a_live_job_holds(shrunk, capsys: pytest.CaptureFixture) -> None:  # noqa: ANN001
    job_file, job = shrunk
    holder = checkpoint_store(job)
    holder.lock(1)  # what a live task instance holds (a flock: another open file description conflicts)
    try:
        before = [checkpoint_store(job).load(p) for p in (0, 1)]
        assert main(["seek", str(job_file), "--input", "events", "--to-end", "--yes"]) == 1
        err = capsys.readouterr().err
        assert "partition 1 of job 'seeking' is held by a running job" in err and "nothing was moved" in err
        assert [checkpoint_store(job).load(p) for p in (0, 1)] == before  # partition 0 was not moved either
    finally:
        holder.unlock(1)
    assert main(["seek", str(job_file), "--input", "events", "--to-end", "--yes"]) == 0


def test_a_stale_driver_save_is_fenced_after_a_seek(shrunk) -> None:  # noqa: ANN001
    """A driver that planned from generation 3 cannot write the old position back over the seek's
    generation 4 checkpoint: its save is fenced."""
    job_file, job = shrunk
    assert main(["seek", str(job_file), "--input", "events", "--partition", "0", "--to-start", "--yes"]) == 0
    stale = Checkpoint(0, generation=3, inputs={"events": 10})
    with pytest.raises(FencedError):
        checkpoint_store(job).save(stale, expect_generation=3)


def test_writes_only_the_checkpoints(shrunk) -> None:  # noqa: ANN001
    job_file, job = shrunk
    before = _files(job_file.parent)
    assert main(["seek", str(job_file), "--input", "events", "--to-end", "--yes"]) == 0
    after = _files(job_file.parent)
    changed = {name for name in set(before) | set(after) if before.get(name) != after.get(name)}
    # the checkpoints, and the (empty) instance lock files it took
    assert changed - {"state/seeking/checkpoints/0.lock", "state/seeking/checkpoints/1.lock"} == \
        {"state/seeking/checkpoints/0.json", "state/seeking/checkpoints/1.json"}
    assert not any(name.endswith(".tmp") for name in after)


def test_unknown_input_partition_or_a_job_that_never_ran(tmp_path: Path, shrunk, capsys) -> None:  # noqa: ANN001
    job_file, _job = shrunk
    assert main(["seek", str(job_file), "--input", "evnts", "--to-end"]) == 1
    assert "no input 'evnts'" in capsys.readouterr().err
    assert main(["seek", str(job_file), "--input", "events", "--partition", "2", "--to-end"]) == 1
    assert "partitions 0..1, not 2" in capsys.readouterr().err
    fresh = write_counting_job(tmp_path / "fresh", "fresh", partitions=1)
    (fresh.parent / "data").mkdir()
    assert main(["seek", str(fresh), "--input", "events", "--to-end", "--yes"]) == 1
    assert "no checkpoint" in capsys.readouterr().err
    assert not (fresh.parent / "state").exists()  # nothing created


def test_a_missing_input_directory_is_refused(shrunk, capsys: pytest.CaptureFixture) -> None:  # noqa: ANN001
    """--to-end on a mistyped (or removed) input path would move every position to 0."""
    job_file, job = shrunk
    for name in os.listdir(job_file.parent / "data"):
        (job_file.parent / "data" / name).unlink()
    (job_file.parent / "data").rmdir()
    assert main(["seek", str(job_file), "--input", "events", "--to-end", "--yes"]) == 1
    assert "inputs.events.path" in capsys.readouterr().err
    assert checkpoint_store(job).load(0).inputs == {"events": 10}


def test_usage_errors() -> None:
    parser = build_parser()
    for argv in (["seek", "job.toml", "--input", "x"],                          # neither --to-start nor --to-end
                 ["seek", "job.toml", "--input", "x", "--to-start", "--to-end"],
                 ["seek", "job.toml", "--to-end"],                              # no --input
                 ["seek", "job.toml", "--input", "x", "--to-end", "--partition", "-1"]):
        with pytest.raises(SystemExit) as exit_:
            parser.parse_args(argv)
        assert exit_.value.code == 2


def test_status_names_each_input_partition_once(shrunk, capsys: pytest.CaptureFixture) -> None:  # noqa: ANN001
    """A position problem is said once per input partition, its heading not repeated (issue #48)."""
    job_file, _job = shrunk
    assert main(["status", str(job_file)]) == 3
    problems = [line for line in capsys.readouterr().out.splitlines() if line.startswith("problem: ")]
    assert len(problems) == 2
    for partition, line in enumerate(problems):
        heading = f"input 'events' partition {partition}"
        assert line.startswith(f"problem: {heading}: ") and line.count(heading) == 1, line
