"""File inputs have an identity (issue 43 item 3), as Kafka topics have ids: a jsonl or file-log
partition replaced under a job, by a shorter, an equal-length or a LONGER file, renamed over or
truncated and written again, even one whose first line is the old first line, is an
InputPositionError (with the ``localstate seek`` hint) in a standing run's planner and at the start
of a run; a partition appended to, or whose read segments were deleted, is not. Without Spark: the
planner and ``check_inputs`` of ``localstate run`` are driven directly."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from counting_job import write_counting_job  # tests/ is on sys.path (tests/conftest.py)
from localstate.changelog.file import FileChangelogSystem
from localstate.changelog.file.format import segment_name
from localstate.core.checkpoint import Checkpoint
from localstate.core.config import load_job_config, parse_job_config
from localstate.runtime.layout import checkpoint_store
from localstate.core.stream import open_input
from localstate.core.stream import IDENTITY_BYTES, FileIdentities
from localstate.errors import InputPositionError
from localstate.runtime.spark.driver import SparkJobRunner
from localstate.tools.cli import main

SPARK = Path(__file__).parents[1] / "spark"


def _jsonl(keys: list[str]) -> bytes:
    return "".join(json.dumps({"key": key, "value": 1}) + "\n" for key in keys).encode()


class _Jsonl:
    """A 1-partition counting job over ``data/0.jsonl``."""

    def __init__(self, tmp: Path) -> None:
        self.job_file = write_counting_job(tmp, "identity", partitions=1)
        (tmp / "data").mkdir()
        self.path = tmp / "data" / "0.jsonl"
        self.tmp = tmp

    def write(self, keys: list[str]) -> None:
        self.path.write_bytes(_jsonl(keys))

    def append(self, keys: list[str]) -> None:
        with open(self.path, "ab") as handle:
            handle.write(_jsonl(keys))

    def rename_over(self, keys: list[str]) -> None:
        new = self.tmp / "new.jsonl"
        new.write_bytes(_jsonl(keys))
        os.replace(new, self.path)

    def rewrite(self, keys: list[str]) -> None:
        with open(self.path, "r+b") as handle:  # same inode
            handle.truncate(0)
            handle.write(_jsonl(keys))


class _FileLog:
    """A 1-partition job over a file-log stream ``logs/events/0``."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.root = tmp / "logs"
        job = parse_job_config({"job": {"name": "identity", "partitions": 1, "task": "count_task:CountByKey",
                                        "state_dir": "state", "pythonpath": [str(SPARK)]},
                                "inputs": {"events": {"system": "file", "path": str(self.root)}}},
                               base_dir=tmp, source=str(tmp / "job.toml"))
        self.job = job
        self.job_file = None

    def _log(self, root: Path, keys: list[str]) -> Path:
        system = FileChangelogSystem({"path": str(root)}, self.tmp)
        system.ensure_stream("events", 1)
        writer = system.partition("events", 0)
        writer.append_many([(json.dumps(key).encode(), b"1") for key in keys])
        writer.flush()
        writer.close()
        return system.partition_dir("events", 0) / segment_name(0)

    @property
    def path(self) -> Path:
        return self.root / "events" / "0" / segment_name(0)

    def write(self, keys: list[str]) -> None:
        self._log(self.root, keys)

    def append(self, keys: list[str]) -> None:
        self._log(self.root, keys)  # the writer appends to the existing log

    def rename_over(self, keys: list[str]) -> None:
        os.replace(self._log(self.tmp / "other", keys), self.path)

    def rewrite(self, keys: list[str]) -> None:
        data = self._log(self.tmp / "other", keys).read_bytes()
        with open(self.path, "r+b") as handle:
            handle.truncate(0)
            handle.write(data)


SYSTEMS = {"jsonl": _Jsonl, "file": _FileLog}
OLD = [f"old-{i}" for i in range(10)]
#: replacements by length and by how they start
REPLACEMENTS = {
    "shorter": [f"new-{i}" for i in range(4)],
    "equal length": [f"new-{i}" for i in range(10)],
    "longer": [f"new-{i}" for i in range(25)],
    "same first line, shorter": OLD[:1] + [f"new-{i}" for i in range(3)],
    "same first line, equal length": OLD[:1] + [f"new-{i}" for i in range(9)],
    "same first line, longer": OLD[:1] + [f"new-{i}" for i in range(40)],
    "same first lines, one changed, longer": OLD[:5] + ["changed"] + OLD[6:] + [f"new-{i}" for i in range(5)],
}


def _setup(tmp: Path, system: str):  # noqa: ANN202
    """The input with OLD, and a checkpoint at its end recording its identity, as a batch commits it;
    returns (the input, its job, the standing runner that planned it)."""
    source = SYSTEMS[system](tmp)
    source.write(OLD)
    job = source.job if system == "file" else load_job_config(source.job_file)
    runner = SparkJobRunner(job, progress=None)
    plans, lag = runner.plan(0)
    assert lag == len(OLD) and plans[0].ranges == {"events": (0, len(OLD))}
    checkpoint_store(job).save(Checkpoint(0, generation=1, inputs={"events": len(OLD)},
                                          input_ids=dict(runner.planner.input_ids[0])))
    assert runner.plan(1) == ([], 0)  # nothing new: no error, no plan
    return source, job, runner


@pytest.mark.parametrize("system", sorted(SYSTEMS))
@pytest.mark.parametrize("how", ["rename_over", "rewrite"])
@pytest.mark.parametrize("replacement", sorted(REPLACEMENTS))
def test_a_replaced_partition_is_refused_by_the_planner_and_at_start(tmp_path: Path, system: str, how: str,
                                                                     replacement: str) -> None:
    source, job, runner = _setup(tmp_path, system)
    getattr(source, how)(REPLACEMENTS[replacement])
    with pytest.raises(InputPositionError) as standing:  # the standing run's next plan
        runner.plan(2)
    with pytest.raises(InputPositionError) as started:  # a run started now, before Spark
        SparkJobRunner(job, progress=None).check_inputs()
    for error in (standing.value, started.value):
        assert (error.input, error.partition, error.position) == ("events", 0, len(OLD))
        assert "localstate seek" in error.hint and "--input events" in error.hint
        assert "another file" in error.message or "past the input's end" in error.message


@pytest.mark.parametrize("system", sorted(SYSTEMS))
def test_an_appended_partition_keeps_its_identity(tmp_path: Path, system: str) -> None:
    source, job, runner = _setup(tmp_path, system)
    for round_ in range(3):
        source.append([f"more-{round_}-{i}" for i in range(IDENTITY_BYTES // 20)])  # past the fingerprinted bytes
        plans, lag = runner.plan(2 + round_)
        assert plans[0].ranges["events"][0] == len(OLD) and lag > 0
        SparkJobRunner(job, progress=None).check_inputs()


def test_a_checkpoint_recorded_on_a_short_file_still_matches_once_it_grew(tmp_path: Path) -> None:
    """The identity fingerprints the bytes there were when it was recorded (fewer than
    IDENTITY_BYTES), so appending never changes it."""
    source, job, runner = _setup(tmp_path, "jsonl")
    recorded = checkpoint_store(job).load(0).input_ids["events"]
    assert int(recorded.split(":")[3]) == source.path.stat().st_size < IDENTITY_BYTES
    source.append([f"k{i}" for i in range(1000)])
    assert open_input(job, "events").identity(0, recorded) == recorded
    assert open_input(job, "events").identity(0) != recorded  # a fresh one fingerprints more bytes


def test_seek_records_the_new_identity_and_the_run_goes_on(tmp_path: Path) -> None:
    source, job, runner = _setup(tmp_path, "jsonl")
    source.rename_over([f"new-{i}" for i in range(25)])
    with pytest.raises(InputPositionError):
        runner.plan(2)
    assert main(["seek", str(source.job_file), "--input", "events", "--to-start", "--yes"]) == 0
    moved = checkpoint_store(job).load(0)
    assert moved.inputs == {"events": 0} and moved.input_ids["events"] == open_input(job, "events").identity(0)
    plans, lag = SparkJobRunner(job, progress=None).plan(3)
    assert lag == 25 and plans[0].ranges == {"events": (0, 25)}


def test_rolled_segments_read_then_deleted_keep_the_identity(tmp_path: Path) -> None:
    """A jsonl input with rolled segments (``<p>.jsonl``, ``<p>.<base>.jsonl``): the identity is its
    first segment's; deleting segments already read is not a replacement, replacing the set is."""
    source = _Jsonl(tmp_path)
    source.write(OLD)
    (tmp_path / "data" / f"0.{10:020d}.jsonl").write_bytes(_jsonl([f"second-{i}" for i in range(10)]))
    job = load_job_config(source.job_file)
    runner = SparkJobRunner(job, progress=None)
    runner.plan(0)
    checkpoint_store(job).save(Checkpoint(0, generation=1, inputs={"events": 15},
                                          input_ids=dict(runner.planner.input_ids[0])))
    assert runner.plan(1)[0][0].ranges == {"events": (15, 20)}
    source.path.unlink()  # the first segment, read: deleted by the operator
    assert runner.plan(2)[0][0].ranges == {"events": (15, 20)}
    SparkJobRunner(job, progress=None).check_inputs()
    shutil.rmtree(tmp_path / "data")  # the whole partition written again: a new first segment
    (tmp_path / "data").mkdir()
    source.write([f"fresh-{i}" for i in range(30)])
    with pytest.raises(InputPositionError):
        runner.plan(3)


def test_identities_are_cached_by_file_status_and_refresh_on_change(tmp_path: Path) -> None:
    path = tmp_path / "0.jsonl"
    path.write_bytes(_jsonl(["a", "b"]))
    identities = FileIdentities()
    first = identities.identity([(0, path)], None, stream="s", partition=0)
    assert first == identities.identity([(0, path)], None, stream="s", partition=0)
    with open(path, "r+b") as handle:  # same size, same inode, other bytes
        handle.write(b'{"key": "c"')
    assert identities.identity([(0, path)], first, stream="s", partition=0) != first
    assert identities.identity([], None, stream="s", partition=0) is None
    empty = tmp_path / "1.jsonl"
    empty.write_bytes(b"")
    assert identities.identity([(0, empty)], None, stream="s", partition=0) is None
    for damaged in ("", "x", "a:b:c:d:e", "0:1:2", "kafka-topic-id"):  # not a file identity: a fresh one
        assert identities.identity([(0, path)], damaged, stream="s", partition=0) != damaged


def test_the_identity_check_is_checked_per_partition(tmp_path: Path) -> None:
    """Partition 1's file appearing later, or being replaced, is no error of partition 0's."""
    job_file = write_counting_job(tmp_path, "two", partitions=2)
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "0.jsonl").write_bytes(_jsonl(OLD))
    job = load_job_config(job_file)
    runner = SparkJobRunner(job, progress=None)
    runner.plan(0)
    assert set(runner.planner.input_ids) == {0}
    checkpoint_store(job).save(Checkpoint(0, generation=1, inputs={"events": 10}, input_ids=runner.planner.input_ids[0]))
    (tmp_path / "data" / "1.jsonl").write_bytes(_jsonl(["x", "y"]))
    plans, lag = runner.plan(1)
    assert [plan.partition for plan in plans] == [1] and lag == 2
    new = tmp_path / "new.jsonl"
    new.write_bytes(_jsonl(["p0-new"] * 12))
    os.replace(new, tmp_path / "data" / "0.jsonl")
    with pytest.raises(InputPositionError) as caught:
        runner.plan(2)
    assert caught.value.partition == 0


def test_identities_compare_content_not_where_the_file_lives() -> None:
    """A job folder copied, or restored from a backup, has its inputs on another device and inode:
    the same records, so the same stream; other first bytes, or another segment, are another one."""
    from localstate.core.stream import same_stream

    assert same_stream("0:2049:77:96:5ce97e08", "0:65024:3073307:96:5ce97e08")
    assert not same_stream("0:2049:77:96:5ce97e08", "0:2049:77:96:00000000")
    assert not same_stream("0:2049:77:96:5ce97e08", "0:2049:77:95:5ce97e08")
    assert not same_stream("0:2049:77:96:5ce97e08", "3:2049:77:96:5ce97e08")
    assert same_stream("topic-id-A", "topic-id-A") and not same_stream("topic-id-A", "topic-id-B")
