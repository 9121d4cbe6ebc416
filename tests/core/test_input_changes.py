"""Inputs that change under a job (issue #37), without Spark: the planner of ``localstate run`` and
the executor's feed check a checkpointed input position against the input as it is now.

An input replaced by a shorter one, truncated, emptied, removed, or a generator asked for fewer
events, with a checkpoint whose position is past the new end, used to plan ``max(start, end)``:
``done: 0 batch(es), 0 records in ... lag 0``, and the records the input holds now were never
read. Each case here ends in an InputPositionError naming the input, partition, checkpointed
position and end, with the ``localstate seek`` command in its hint. Unterminated tails (a jsonl line
without its newline, an incomplete file-log record) are counted (``PendingTail``), shown by the
planner and ``inspect``, and logged as a WARNING once they have stayed unchanged for
``PENDING_TAIL_WARN_AFTER`` seconds (file modification times are set, not waited for).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from pathlib import Path

import pytest

from counting_job import write_counting_job  # tests/ is on sys.path (tests/conftest.py)
from localstate.changelog.file import FileChangelogSystem
from localstate.changelog.file.format import list_segments, segment_name
from localstate.core.checkpoint import Checkpoint
from localstate.core.config import load_job_config, parse_job_config
from localstate.runtime.layout import checkpoint_store
from localstate.core.options import Option
from localstate.core.stream import open_input
from localstate.core.stream import PENDING_TAIL_WARN_AFTER, InputStream, PendingTail, RetainedStart, \
    check_input_position
from localstate.errors import CheckpointError, ConfigError, InputError, InputPositionError
from localstate.runtime.spark.driver import SparkJobRunner
from localstate.runtime.spark.executor import plan_records
from localstate.runtime.driver.plan import PartitionPlan, lag_text, progress_line, BatchResult
from localstate.tools.cli import main


def _lines(count: int, prefix: str = "k") -> str:
    return "".join(json.dumps({"key": f"{prefix}{i}", "value": i}) + "\n" for i in range(count))


def _job(tmp_path: Path, lines: int = 10, position: int | None = None, **variant):  # noqa: ANN003, ANN202
    """A 1-partition counting job over ``data/0.jsonl`` (``lines`` lines) and, with ``position``, a
    committed checkpoint naming that position of input ``events``."""
    job_file = write_counting_job(tmp_path, "changing", partitions=1, **variant)
    (tmp_path / "data").mkdir(exist_ok=True)
    (tmp_path / "data" / "0.jsonl").write_text(_lines(lines))
    job = load_job_config(job_file)
    if position is not None:
        checkpoint_store(job).save(Checkpoint(0, generation=1, inputs={"events": position}))
    return job_file, job


def _assert_position_error(error: InputPositionError, position: int, end: int, job_file: Path | None = None) -> None:
    assert (error.input, error.partition, error.position, error.end) == ("events", 0, position, end)
    assert error.context["stream"] == "events" and error.context["position"] == position
    assert isinstance(error, InputError)
    assert "localstate seek" in error.hint and "--input events" in error.hint and "--to-start" in error.hint
    if job_file is not None:
        assert str(job_file) in error.hint


def _plan_error(job) -> InputPositionError:  # noqa: ANN001
    runner = SparkJobRunner(job, progress=None)
    with pytest.raises(InputPositionError) as planned:
        runner.plan(0)
    with pytest.raises(InputPositionError) as checked:  # what run() does before it starts Spark
        runner.check_inputs()
    assert str(planned.value) == str(checked.value)
    return planned.value


# -- a position past the input's end ---------------------------------------------------------------

def test_jsonl_replaced_by_a_shorter_file_is_a_typed_error(tmp_path: Path) -> None:
    job_file, job = _job(tmp_path, lines=10, position=10)
    replacement = tmp_path / "new.jsonl"
    replacement.write_text(_lines(5, prefix="new"))
    os.replace(replacement, tmp_path / "data" / "0.jsonl")  # a new file (new inode) under the same name
    error = _plan_error(job)
    _assert_position_error(error, 10, 5, job_file)
    assert error.context["path"] == str((tmp_path / "data").resolve())


def test_jsonl_truncated_in_place_is_a_typed_error(tmp_path: Path) -> None:
    _job_file, job = _job(tmp_path, lines=10, position=8)
    runner = SparkJobRunner(job, progress=None)
    assert runner.plan(0)[1] == 2  # reads the file once (the line count is cached by inode and size)
    with open(tmp_path / "data" / "0.jsonl", "r+") as handle:  # same inode, shorter
        handle.truncate(len(_lines(3)))
    _assert_position_error(_plan_error(job), 8, 3)


def test_empty_file_replacing_the_input(tmp_path: Path) -> None:
    _job_file, job = _job(tmp_path, lines=10, position=10)
    (tmp_path / "data" / "0.jsonl").write_text("")
    _assert_position_error(_plan_error(job), 10, 0)


def test_input_file_or_directory_removed(tmp_path: Path) -> None:
    job_file, job = _job(tmp_path, lines=10, position=4)
    (tmp_path / "data" / "0.jsonl").unlink()
    _assert_position_error(_plan_error(job), 4, 0)
    shutil.rmtree(tmp_path / "data")
    _assert_position_error(_plan_error(job), 4, 0)  # the runner's API: the position check
    assert main(["run", str(job_file)]) == 1  # the CLI refuses the missing directory first (ConfigError)


def test_huge_checkpoint_position(tmp_path: Path) -> None:
    _job_file, job = _job(tmp_path, lines=10, position=2**63 - 1)
    _assert_position_error(_plan_error(job), 2**63 - 1, 10)


def test_negative_checkpoint_position_is_a_corrupt_checkpoint(tmp_path: Path) -> None:
    _job_file, job = _job(tmp_path, lines=10, position=3)
    path = checkpoint_store(job).path(0)
    data = json.loads(path.read_text())
    data["inputs"]["events"] = -5
    path.write_text(json.dumps(data))
    with pytest.raises(CheckpointError, match="inputs.events"):
        SparkJobRunner(job, progress=None).plan(0)


def test_position_at_the_end_and_no_position_are_fine(tmp_path: Path) -> None:
    _job_file, job = _job(tmp_path, lines=10, position=10)
    runner = SparkJobRunner(job, progress=None)
    assert runner.plan(0) == ([], 0)
    checkpoint_store(job).save(Checkpoint(0, generation=2, inputs={}))
    plans, lag = runner.plan(0)
    assert lag == 10 and plans[0].ranges == {"events": (0, 10)}


def test_cli_run_fails_before_spark_with_the_typed_error(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    job_file, _job_config = _job(tmp_path, lines=5, position=10)
    assert main(["run", str(job_file)]) == 1
    err = capsys.readouterr().err
    assert "InputPositionError" not in err  # the message, not a traceback
    assert "position 10 is past the input's end 5" in err and "localstate seek" in err
    assert "done:" not in capsys.readouterr().out


def test_file_log_input_truncated_is_a_typed_error(tmp_path: Path) -> None:
    system = FileChangelogSystem({"path": str(tmp_path / "logs")}, tmp_path)
    system.ensure_stream("events", 1)
    writer = system.partition("events", 0)
    writer.append_many([(b'"k%d"' % i, b"%d" % i) for i in range(10)])
    writer.flush()
    writer.close()
    job = parse_job_config({"job": {"name": "j", "partitions": 1, "task": "count_task:CountByKey",
                                    "state_dir": "state", "pythonpath": [str(Path(__file__).parents[1] / "spark")]},
                            "inputs": {"events": {"system": "file", "path": str(tmp_path / "logs")}}},
                           base_dir=tmp_path, source=str(tmp_path / "job.toml"))
    checkpoint_store(job).save(Checkpoint(0, generation=1, inputs={"events": 10}))
    assert SparkJobRunner(job, progress=None).plan(0) == ([], 0)
    shutil.rmtree(tmp_path / "logs")  # the producer starts its log again, with 4 records
    system = FileChangelogSystem({"path": str(tmp_path / "logs")}, tmp_path)
    system.ensure_stream("events", 1)
    writer = system.partition("events", 0)
    writer.append_many([(b'"n%d"' % i, b"%d" % i) for i in range(4)])
    writer.flush()
    writer.close()
    _assert_position_error(_plan_error(job), 10, 4)


def test_generator_asked_for_fewer_events(tmp_path: Path) -> None:
    def job_with(events: int):  # noqa: ANN202
        return parse_job_config({"job": {"name": "g", "partitions": 1, "task": "count_task:CountByKey",
                                         "state_dir": "state",
                                         "pythonpath": [str(Path(__file__).parents[1] / "spark")]},
                                 "inputs": {"events": {"system": "generator", "kind": "page_views",
                                                       "events": events}}},
                                base_dir=tmp_path, source=str(tmp_path / "job.toml"))

    checkpoint_store(job_with(100)).save(Checkpoint(0, generation=1, inputs={"events": 80}))
    assert SparkJobRunner(job_with(100), progress=None).plan(0)[1] == 20
    _assert_position_error(_plan_error(job_with(50)), 80, 50)


class _Retaining(InputStream):
    """An input whose first 6 records were deleted (like a Kafka log start offset of 6)."""

    system = "test"
    options = {"path": Option(str, default="")}

    def end_offset(self, partition: int) -> int:
        return 10

    def start_offset(self, partition: int) -> int:
        return 6

    def read(self, partition, start, end):  # noqa: ANN001, ANN201
        return iter(())


def test_position_below_the_log_start_is_a_typed_error(tmp_path: Path) -> None:
    _job_file, job = _job(tmp_path)
    source = _Retaining(job, job.inputs["events"])
    assert isinstance(source, RetainedStart) and not isinstance(source, PendingTail)
    with pytest.raises(InputPositionError) as below:
        check_input_position(source, 0, 4, 10)
    assert (below.value.position, below.value.start, below.value.end) == (4, 6, 10)
    assert "records 4..5 were deleted" in str(below.value) and "--to-start moves to 6" in below.value.hint
    check_input_position(source, 0, 6, 10)   # at the log start: nothing lost
    check_input_position(source, 0, 0, 10)   # never read anything: starts wherever the input starts
    check_input_position(source, 0, None, 10)


class _Instance:
    """What plan_records asks of a task instance: its positions."""

    def __init__(self, positions: dict[str, int]) -> None:
        self.positions = positions

    def position(self, name: str) -> int:
        return self.positions.get(name, 0)


def test_a_task_instance_ahead_of_its_plan_refuses_to_read(tmp_path: Path) -> None:
    """The executor side: an instance whose position is past the planned end would read nothing and
    report the batch done; it raises the same typed error instead."""
    _job_file, job = _job(tmp_path, lines=5)
    inputs = {"events": open_input(job, "events")}
    plan = PartitionPlan(0, 0, {"events": (2, 5)}, None)
    assert [r.offset for _, r in plan_records(_Instance({"events": 2}), plan, inputs)] == [2, 3, 4]
    with pytest.raises(InputPositionError) as ahead:
        plan_records(_Instance({"events": 9}), plan, inputs)
    assert (ahead.value.position, ahead.value.end) == (9, 5) and "localstate seek" in ahead.value.hint


def test_the_error_survives_pickling() -> None:
    import pickle

    error = InputPositionError("x", input="events", partition=1, position=10, end=5, hint="h")
    copy = pickle.loads(pickle.dumps(error))
    assert (copy.input, copy.partition, copy.position, copy.end, copy.start) == ("events", 1, 10, 5, None)
    assert str(copy) == str(error)


# -- unterminated tails --------------------------------------------------------------------------------

def _age(path: Path, seconds: float) -> None:
    """Make ``path`` look last written ``seconds`` ago."""
    when = time.time() - seconds
    os.utime(path, (when, when))


def test_jsonl_unterminated_tail_is_counted_and_warned_about(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    _job_file, job = _job(tmp_path, lines=4)
    path = tmp_path / "data" / "0.jsonl"
    tail = b'{"key":"half","val'
    with open(path, "ab") as handle:
        handle.write(tail)
    source = open_input(job, "events")
    assert isinstance(source, PendingTail)
    assert (source.end_offset(0), source.pending_bytes(0)) == (4, len(tail))
    runner = SparkJobRunner(job, progress=None)
    with caplog.at_level(logging.WARNING, logger="localstate"):
        plans, lag = runner.plan(0)
    assert lag == 4 and runner.planner.pending_bytes == len(tail)
    assert not [r for r in caplog.records if "unterminated" in r.getMessage()]  # just written: in progress

    _age(path, PENDING_TAIL_WARN_AFTER + 30)
    with caplog.at_level(logging.WARNING, logger="localstate"):
        runner.plan(0)
        runner.plan(1)  # once per tail and run
    warnings = [r for r in caplog.records if "unterminated" in r.getMessage()]
    assert len(warnings) == 1 and warnings[0].levelno == logging.WARNING
    message = warnings[0].getMessage()
    assert "input 'events' partition 0" in message and f"{len(tail)} byte(s)" in message and "offset 4" in message

    with open(path, "ab") as handle:  # the writer completes the line: it is read, nothing pending
        handle.write(b'ue":1}\n')
    plans, lag = runner.plan(0)
    assert lag == 5 and runner.planner.pending_bytes == 0 and source.pending_bytes(0) == 0


def test_jsonl_tail_only_no_newline_at_all(tmp_path: Path) -> None:
    _job_file, job = _job(tmp_path, lines=0)
    (tmp_path / "data" / "0.jsonl").write_bytes(b'{"key":"a","value":1}')
    source = open_input(job, "events")
    assert (source.end_offset(0), source.pending_bytes(0)) == (0, 21)
    assert source.pending_since(0) == pytest.approx(os.stat(tmp_path / "data" / "0.jsonl").st_mtime)
    runner = SparkJobRunner(job, progress=None)
    assert runner.plan(0) == ([], 0) and runner.planner.pending_bytes == 21


def test_file_log_incomplete_last_record_is_counted(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    system = FileChangelogSystem({"path": str(tmp_path / "logs")}, tmp_path)
    system.ensure_stream("events", 1)
    writer = system.partition("events", 0)
    writer.append_many([(b'"k%d"' % i, b"%d" % i) for i in range(3)])
    writer.flush()
    writer.close()
    directory = system.partition_dir("events", 0)
    segment = directory / segment_name(list_segments(directory)[-1])
    complete = segment.read_bytes()
    record = len(complete) // 3
    with open(segment, "ab") as handle:  # half of a fourth record, as a writer cut short leaves it
        handle.write(complete[:record // 2])
    job = parse_job_config({"job": {"name": "j", "partitions": 1, "task": "count_task:CountByKey",
                                    "state_dir": "state", "pythonpath": [str(Path(__file__).parents[1] / "spark")]},
                            "inputs": {"events": {"system": "file", "path": str(tmp_path / "logs")}}},
                           base_dir=tmp_path, source=str(tmp_path / "job.toml"))
    source = open_input(job, "events")
    assert isinstance(source, PendingTail)
    assert (source.end_offset(0), source.pending_bytes(0)) == (3, record // 2)
    _age(segment, PENDING_TAIL_WARN_AFTER * 3)
    runner = SparkJobRunner(job, progress=None)
    with caplog.at_level(logging.WARNING, logger="localstate"):
        plans, lag = runner.plan(0)
    assert lag == 3 and runner.planner.pending_bytes == record // 2
    assert [r for r in caplog.records if f"{record // 2} byte(s)" in r.getMessage()]


def test_kafka_and_generator_inputs_have_no_pending_tail(tmp_path: Path) -> None:
    from localstate.changelog.kafka.streams import KafkaInput
    from localstate.streams.generator import GeneratorInput

    assert not issubclass(GeneratorInput, PendingTail) and not hasattr(KafkaInput, "pending_bytes")
    assert hasattr(KafkaInput, "start_offset")


def test_progress_and_done_lines_show_unterminated_bytes() -> None:
    assert lag_text(0, 0) == "lag 0"
    assert lag_text(1200, 37) == "lag 1,200 (+37 bytes unterminated)"
    line = progress_line(BatchResult(3, records_in=5, lag=0, pending_bytes=21, seconds=1.0), 1)
    assert line.endswith("lag 0 (+21 bytes unterminated)")


# -- inspect -------------------------------------------------------------------------------------------

def test_inspect_shows_positions_ends_and_unterminated_bytes(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    job_file, _job_config = _job(tmp_path, lines=5, position=10)
    with open(tmp_path / "data" / "0.jsonl", "ab") as handle:
        handle.write(b'{"key":"x"')
    capsys.readouterr()
    assert main(["inspect", str(job_file)]) == 0
    out = capsys.readouterr().out
    assert "inputs:" in out and "UNTERMINATED_BYTES" in out
    assert "events[0]: input 'events' partition 0: the checkpoint's position 10 is past the input's end 5" in out
    assert "events[0]: 10 byte(s) of an unterminated record at offset 5" in out
    assert main(["inspect", str(job_file), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    [row] = data["input_partitions"]
    assert (row["input"], row["partition"], row["position"], row["end"], row["lag"], row["pending_bytes"]) == \
        ("events", 0, 10, 5, None, 10)
    assert "past the input's end" in row["problem"] and row["pending_since"] is not None


def test_inspect_of_a_healthy_input(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    job_file, _job_config = _job(tmp_path, lines=5, position=3)
    assert main(["inspect", str(job_file), "--json"]) == 0
    [row] = json.loads(capsys.readouterr().out)["input_partitions"]
    assert (row["position"], row["end"], row["lag"], row["pending_bytes"], row["problem"]) == (3, 5, 2, 0, None)


def test_missing_input_directory_in_the_cli_is_a_config_error(tmp_path: Path) -> None:
    job_file, _job_config = _job(tmp_path, lines=5, position=3)
    shutil.rmtree(tmp_path / "data")
    from localstate.tools.validation import require_input_paths

    with pytest.raises(ConfigError, match="inputs.events.path"):
        require_input_paths(load_job_config(job_file))


def test_a_replaced_jsonl_file_is_never_read_from_a_byte_position_of_the_old_one(tmp_path: Path) -> None:
    """A reused Python worker remembers where its previous batch stopped (file, line -> byte); a
    file replaced under the same name must be read from its own lines, not from that byte."""
    _job_file, job = _job(tmp_path, lines=8)
    source = open_input(job, "events")
    assert [r.key for r in source.read(0, 0, 5)] == ["k0", "k1", "k2", "k3", "k4"]  # remembers line 5's byte
    replacement = tmp_path / "new.jsonl"
    replacement.write_text("".join(json.dumps({"key": f"longer-key-{i}", "value": i}) + "\n" for i in range(8)))
    os.replace(replacement, tmp_path / "data" / "0.jsonl")
    assert [r.key for r in source.read(0, 5, 8)] == ["longer-key-5", "longer-key-6", "longer-key-7"]
