"""Issue #33 part 3: `jsonl` and `file` outputs roll into segments (`segment_bytes`), so no output
file grows forever, and stay exactly-once: a crash between the output write and the checkpoint is
rolled back across segments (the segment holding the checkpoint's offset truncated, later ones
deleted), readers see one stream, and a segment deleted or truncated by hand is a typed OutputError
naming the file."""

import textwrap
from pathlib import Path

import pytest

from localstate.core.config import load_job_config
from localstate.runtime.layout import open_changelog_system
from localstate.core.stream import open_output
from localstate.core.task import Envelope, StreamTask
from localstate.errors import OutputError
from localstate.runtime.partition.instance import TaskInstance
from localstate.runtime.partition.sink import StreamSink

SEGMENT = 300
PER_BATCH = 4
BATCHES = 30


class Echo(StreamTask):
    def process(self, envelope, collector, coordinator):
        collector.send("reports", envelope.key, envelope.value)


def job_file(tmp_path: Path, system: str) -> Path:
    path = tmp_path / "job.toml"
    path.write_text(textwrap.dedent(f"""
        [job]
        name = "echo"
        task = "test_output_segments:Echo"
        [inputs.events]
        system = "jsonl"
        path = "in"
        [outputs.reports]
        system = "{system}"
        path = "out"
        segment_bytes = {SEGMENT}
    """))
    return path


def start(path: Path) -> TaskInstance:
    job = load_job_config(path)
    sink = StreamSink(job)
    instance = TaskInstance(job, 0, open_changelog_system(job), sink=sink, task_factory=Echo)
    try:
        instance.open()
    except BaseException:
        sink.close()
        raise
    instance.test_sink = sink
    return instance


def crash(instance: TaskInstance) -> None:
    """The process dies: the instance lets go, and so do the output writers (their locks)."""
    instance.abandon()
    instance.test_sink.close()


def records(path: Path) -> list:
    stream = open_output(load_job_config(path), "reports")
    try:
        return list(stream.read(0))
    finally:
        stream.close()


def segment_files(tmp_path: Path, system: str) -> list[Path]:
    if system == "jsonl":
        def base(segment: Path) -> int:
            return 0 if segment.name == "0.jsonl" else int(segment.name.split(".")[1])
        return sorted((tmp_path / "out").glob("0.*jsonl"), key=base)
    return sorted((tmp_path / "out" / "reports" / "0").glob("*.log"))


def feed(instance: TaskInstance, first: int, count: int) -> None:
    for offset in range(first, first + count):
        instance.process(Envelope("events", 0, offset, f"key-{offset:05d}", {"n": offset, "pad": "x" * 20}))


def expected(count: int) -> list:
    return [(f"key-{offset:05d}", {"n": offset, "pad": "x" * 20}) for offset in range(count)]


def run_batches(path: Path, batches: int) -> int:
    instance = start(path)
    offset = instance.position("events")
    for _ in range(batches):
        feed(instance, offset, PER_BATCH)
        offset += PER_BATCH
        instance.commit()
    instance.close(commit=True)
    return offset


@pytest.fixture(autouse=True)
def _importable(monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).parent))


@pytest.mark.parametrize("system", ["jsonl", "file"])
def test_outputs_roll_and_a_crash_is_rolled_back_across_segments(tmp_path, system):
    path = job_file(tmp_path, system)
    committed = run_batches(path, BATCHES)
    segments = segment_files(tmp_path, system)
    assert len(segments) > 5, segments
    assert all(s.stat().st_size < SEGMENT + PER_BATCH * 100 for s in segments)  # segment_bytes + one batch
    assert records(path) == expected(committed)
    # A crash between the output write and the checkpoint, with enough output to roll new segments.
    instance = start(path)
    feed(instance, committed, PER_BATCH * 6)
    instance.prepare_commit()  # outputs written (new segments), checkpoint not
    crash(instance)
    assert len(records(path)) == committed + PER_BATCH * 6
    assert len(segment_files(tmp_path, system)) > len(segments)
    # Restart: outputs back to the checkpoint (later segments deleted), then the input re-delivered.
    instance = start(path)
    assert instance.position("events") == committed
    assert records(path) == expected(committed)
    assert segment_files(tmp_path, system) == segments
    feed(instance, committed, PER_BATCH * 6)
    instance.close(commit=True)
    assert records(path) == expected(committed + PER_BATCH * 6)  # no duplicate, no loss


def test_jsonl_segments_read_as_one_input_stream(tmp_path):
    path = job_file(tmp_path, "jsonl")
    committed = run_batches(path, BATCHES)
    from localstate.core.stream import open_input
    job = load_job_config(path)
    job.inputs["events"].options["path"] = "out"
    source = open_input(job, "events")
    assert source.end_offset(0) == committed
    got = [(r.offset, r.key) for r in source.read(0, 7, committed - 3)]
    assert got == [(o, f"key-{o:05d}") for o in range(7, committed - 3)]


@pytest.mark.parametrize("damage", ["delete-last", "truncate-last", "delete-middle"])
def test_a_segment_damaged_by_hand_is_a_typed_error_naming_it(tmp_path, damage):
    path = job_file(tmp_path, "jsonl")
    run_batches(path, BATCHES)
    segments = segment_files(tmp_path, "jsonl")
    if damage == "delete-last":
        victim = segments[-1]
        victim.unlink()
    elif damage == "truncate-last":
        victim = segments[-1]
        victim.write_bytes(victim.read_bytes()[:10])
    else:
        victim = segments[len(segments) // 2]
        victim.unlink()
    if damage == "delete-middle":
        # The one logical stream has a hole: reading it says where.
        with pytest.raises(OutputError) as info:
            records(path)
        assert str(segments[len(segments) // 2 - 1]) in str(info.value) and "by hand" in str(info.value)
    else:
        # The checkpoint's position is past what the segments hold: the restart refuses, naming the file.
        with pytest.raises(OutputError) as info:
            start(path)
        assert "by hand" in str(info.value)
        assert str(segments[-2] if damage == "delete-last" else victim) in str(info.value)


def test_a_file_output_segment_deleted_by_hand_is_a_typed_error(tmp_path):
    path = job_file(tmp_path, "file")
    run_batches(path, BATCHES)
    segments = segment_files(tmp_path, "file")
    segments[-1].unlink()
    with pytest.raises(OutputError) as info:
        start(path)
    assert "by hand" in str(info.value) and str(segments[-2]) in str(info.value)


def test_segments_read_and_deleted_by_the_operator_are_accepted(tmp_path):
    """Sealed segments whose lines all lie before the checkpoint's position may be deleted (an
    operator freeing the disk after downstream read them): restarts, rollbacks and reads go on."""
    path = job_file(tmp_path, "jsonl")
    committed = run_batches(path, BATCHES)
    segments = segment_files(tmp_path, "jsonl")
    for segment in segments[:-2]:
        segment.unlink()
    first = int(segments[-2].name.split(".")[1])
    assert records(path) == expected(committed)[first:]
    # A crash with uncommitted output rolled into new segments, then the restart's rollback.
    instance = start(path)
    feed(instance, committed, PER_BATCH * 6)
    instance.prepare_commit()
    crash(instance)
    instance = start(path)
    assert instance.position("events") == committed
    assert segment_files(tmp_path, "jsonl") == segments[-2:]
    feed(instance, committed, PER_BATCH * 3)
    instance.close(commit=True)
    assert records(path) == expected(committed + PER_BATCH * 3)[first:]
    # Read as another job's input: it starts at the first segment still there.
    from localstate.core.stream import open_input
    job = load_job_config(path)
    job.inputs["events"].options["path"] = "out"
    source = open_input(job, "events")
    assert source.start_offset(0) == first
    assert [r.offset for r in source.read(0, first, first + 5)] == list(range(first, first + 5))


def test_deleting_the_segment_that_holds_the_checkpoint_is_a_typed_error(tmp_path):
    """A rollback to a position inside a deleted segment cannot be done: OutputError naming it."""
    path = job_file(tmp_path, "jsonl")
    run_batches(path, BATCHES)
    segments = segment_files(tmp_path, "jsonl")
    for segment in segments[:-1]:
        segment.unlink()
    position = int(segments[-2].name.split(".")[1]) + 1  # a line of a deleted segment
    stream = open_output(load_job_config(path), "reports")
    try:
        with pytest.raises(OutputError) as info:
            stream.truncate(0, position)
    finally:
        stream.close()
    assert f"position {position}" in str(info.value) and "by hand" in str(info.value)
    assert segment_files(tmp_path, "jsonl") == segments[-1:]  # nothing deleted or truncated


def test_an_input_below_its_first_retained_segment_is_an_input_position_error(tmp_path):
    """A job reading a rolled output whose oldest segments were deleted before it read them is
    stopped (InputPositionError naming the input), never silently skipped ahead."""
    from localstate.core.stream import open_input
    from localstate.core.stream import check_input_position
    from localstate.errors import InputPositionError

    path = job_file(tmp_path, "jsonl")
    run_batches(path, BATCHES)
    segments = segment_files(tmp_path, "jsonl")
    for segment in segments[:3]:
        segment.unlink()
    first = int(segments[3].name.split(".")[1])
    job = load_job_config(path)
    job.inputs["events"].options["path"] = "out"
    source = open_input(job, "events")
    check_input_position(source, 0, first, source.end_offset(0))  # at the first retained line: fine
    with pytest.raises(InputPositionError) as info:
        check_input_position(source, 0, first - 1, source.end_offset(0))
    assert info.value.start == first and info.value.input == "events"


def test_a_jsonl_output_end_counts_its_own_appends_and_what_others_wrote(tmp_path):
    """The end an append returns (the checkpoint's output position) counts the lines of that append on
    top of the last one's, and counts the file again when it is not as that append left it."""
    job = load_job_config(job_file(tmp_path, "jsonl"))
    output = open_output(job, "reports")
    segment = tmp_path / "out" / "0.jsonl"
    assert output.append(0, [("a", 1), ("b", 2)]) == 2
    assert output.append(0, []) == 2
    assert output.append(0, [("c", 3)]) == 3
    with open(segment, "a") as handle:  # written by someone else (a zombie, by hand)
        handle.write('{"key":"x","value":0}\n')
    assert output.append(0, []) == 4
    assert output.append(0, [("d", 4)]) == 5
    assert output.truncate(0, 1) == 1
    assert output.append(0, [("e", 5)]) == 2
    assert [key for key, _ in output.read(0)] == ["a", "e"]
