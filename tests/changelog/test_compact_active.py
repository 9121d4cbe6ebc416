"""`localstate compact` reaches the records of the active segment (it seals an idle one first), reports
whole-stream figures, never compacts past the checkpoint, and a later restore gives identical state."""

from __future__ import annotations

import re
import shutil
import textwrap
from pathlib import Path

from localstate.changelog.file.format import list_segments
from localstate.tools.cli import main
from localstate.core.config import JobConfig, load_job_config
from localstate.runtime.layout import open_changelog_system, store_directory
from localstate.runtime.partition.instance import TaskInstance
from localstate.core.task import Envelope, StreamTask

STREAM = "active-counts-changelog"


class Tally(StreamTask):
    """Counts per key; the value ``"del"`` deletes the key."""

    def init(self, context):  # noqa: ANN001
        self.counts = context.store("counts")

    def process(self, envelope, collector, coordinator):  # noqa: ANN001
        if envelope.value == "del":
            self.counts.delete(envelope.key)
        else:
            self.counts.put(envelope.key, (self.counts.get(envelope.key) or 0) + 1)


def make_job(tmp_path: Path, backend: str = "rocksdb", extra: str = "") -> tuple[Path, JobConfig]:
    job_file = tmp_path / "job.toml"
    job_file.write_text(textwrap.dedent(f"""
        [job]
        name = "active"
        task = "x:y"
        commit_every = 500
        [changelogs.file]
        fsync = false
        {extra}
        [stores.counts]
        engine = "kv"
        backend = "{backend}"
        key_serde = "string"
        value_serde = "int"
    """))
    return job_file, load_job_config(job_file)


def run(job: JobConfig, envelopes: list[Envelope], commit: bool = True) -> TaskInstance:
    instance = TaskInstance(job, 0, open_changelog_system(job), task_factory=Tally)
    instance.open()
    for envelope in envelopes:
        instance.process(envelope)
    if commit:
        instance.commit()
    return instance


def reader_records(job: JobConfig) -> list:
    return list(open_changelog_system(job).reader(STREAM, 0).read())


def restored(job: JobConfig, wipe: bool = True) -> dict:
    if wipe:
        shutil.rmtree(store_directory(job, "counts", 0))
    instance = TaskInstance(job, 0, open_changelog_system(job), task_factory=Tally)
    instance.open()
    try:
        return dict(instance.stores["counts"].engine.all())
    finally:
        instance.close(commit=False)


def feed(start: int, n: int, keys: int = 20) -> list[Envelope]:
    return [Envelope("in", 0, i, f"k{i % keys}", "del" if i % 97 == 0 else i) for i in range(start, start + n)]


def test_compact_reduces_a_single_active_segment_and_restore_is_identical(tmp_path, capsys):
    job_file, job = make_job(tmp_path)
    run(job, feed(0, 1215)).close(commit=True)
    directory = open_changelog_system(job).partition_dir(STREAM, 0)
    assert len(list_segments(directory)) == 1  # everything is in the (64 MB default) active segment
    expected = restored(job, wipe=False)
    before = reader_records(job)
    before_bytes = sum(p.stat().st_size for p in directory.glob("*.log"))

    assert main(["compact", str(job_file)]) == 0
    out = capsys.readouterr().out
    after = reader_records(job)
    assert len(after) < len(before) and len(after) <= 20
    match = re.search(r"([\d,]+) -> ([\d,]+) records, ([\d,.]+ [kM]?B) -> ([\d,.]+ [kM]?B)", out)
    assert match, out
    assert int(match.group(1).replace(",", "")) == len(before)
    assert int(match.group(2).replace(",", "")) == len(after)
    after_bytes = sum(p.stat().st_size for p in directory.glob("*.log"))
    assert after_bytes < before_bytes
    assert restored(job) == expected
    # The job goes on writing after compaction; offsets continue, state stays exact.
    run(job, feed(1215, 300)).close(commit=True)
    full = restored(job, wipe=False)
    assert restored(job) == full


def test_compact_several_partitions_figures_are_whole_stream(tmp_path, capsys):
    job_file, job = make_job(tmp_path, extra='segment_bytes = "2kB"')
    run(job, feed(0, 5000)).close(commit=True)
    before = reader_records(job)
    assert main(["compact", str(job_file)]) == 0
    out = capsys.readouterr().out
    match = re.search(r"([\d,]+) -> ([\d,]+) records", out)
    assert int(match.group(1).replace(",", "")) == len(before)
    assert int(match.group(2).replace(",", "")) == len(reader_records(job))
    # Compacting again changes nothing and says so.
    assert main(["compact", str(job_file)]) == 0
    again = re.search(r"([\d,]+) -> ([\d,]+) records", capsys.readouterr().out)
    assert again.group(1) == again.group(2)


def test_compact_never_passes_the_checkpoint_and_trim_still_works(tmp_path, capsys):
    job_file, job = make_job(tmp_path)
    instance = run(job, feed(0, 400))
    committed = dict(instance.stores["counts"].engine.all())
    for envelope in feed(400, 150):
        instance.process(envelope)
    instance.prepare_commit()  # changelog holds uncommitted records past the checkpoint ...
    instance.abandon()         # ... and the instance dies before the checkpoint
    offsets_after = [r.offset for r in reader_records(job) if r.offset >= 400]
    assert main(["compact", str(job_file)]) == 0
    assert [r.offset for r in reader_records(job) if r.offset >= 400] == offsets_after
    assert restored(job) == committed


def test_compact_alongside_a_live_writer_compacts_sealed_segments_only(tmp_path, capsys):
    job_file, job = make_job(tmp_path, extra='segment_bytes = "1kB"')
    instance = run(job, feed(0, 6000))  # stays open: holds the changelog writer lock
    directory = open_changelog_system(job).partition_dir(STREAM, 0)
    assert len(list_segments(directory)) > 2
    active = list_segments(directory)[-1]
    active_bytes = (directory / f"{active:020d}.log").read_bytes()
    before = len(reader_records(job))
    assert main(["compact", str(job_file)]) == 0
    assert len(reader_records(job)) < before
    assert list_segments(directory)[-1] == active
    assert (directory / f"{active:020d}.log").read_bytes() == active_bytes  # the writer's file untouched
    for envelope in feed(6000, 200):
        instance.process(envelope)
    instance.close(commit=True)
    expected = restored(job, wipe=False)
    assert restored(job) == expected
