"""Outputs never destroy data the job did not write: pre-existing output partitions survive a first
start (OutputError unless `overwrite = true`), an output over an input (or another output) is
refused at validate and at run, and the job's own uncommitted outputs are still rolled back."""

import textwrap
from pathlib import Path

import pytest

from localstate.tools.cli import main
from localstate.core.config import load_job_config
from localstate.runtime.layout import open_changelog_system
from localstate.runtime.partition.instance import TaskInstance
from localstate.core.stream import open_output
from localstate.runtime.partition.sink import StreamSink
from localstate.streams.jsonl import read_jsonl, write_jsonl
from localstate.core.task import Envelope, StreamTask
from localstate.errors import ConfigError, OutputError


class Echo(StreamTask):
    def process(self, envelope, collector, coordinator):
        collector.send("reports", envelope.key, envelope.value)


def job_file(tmp_path: Path, output: str, *, input_path: str = "in", overwrite: bool | None = None) -> Path:
    path = tmp_path / "job.toml"
    flag = "" if overwrite is None else f"overwrite = {'true' if overwrite else 'false'}\n"
    path.write_text(textwrap.dedent(f"""
        [job]
        name = "echo"
        task = "test_output_safety:Echo"
        [inputs.events]
        system = "jsonl"
        path = "{input_path}"
        [outputs.reports]
    """) + output + flag)
    return path


JSONL = 'system = "jsonl"\npath = "reports"\n'
FILE = 'system = "file"\npath = "out"\n'


def start(path: Path) -> TaskInstance:
    job = load_job_config(path)
    instance = TaskInstance(job, 0, open_changelog_system(job), sink=StreamSink(job), task_factory=Echo)
    instance.open()
    return instance


def existing_records(path: Path, output: str) -> list:
    job = load_job_config(path)
    stream = open_output(job, "reports")
    try:
        return list(stream.read(0))
    finally:
        stream.close()


@pytest.mark.parametrize("output", [JSONL, FILE], ids=["jsonl", "file"])
def test_preexisting_output_survives_a_first_start(tmp_path, monkeypatch, output):
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    path = job_file(tmp_path, output)
    stream = open_output(load_job_config(path), "reports")
    stream.append(0, [(f"k{i}", i) for i in range(1000)])
    stream.close()
    before = existing_records(path, output)
    assert len(before) == 1000
    with pytest.raises(OutputError) as info:
        start(path)
    text = str(info.value)
    assert "1000 record(s)" in text and "overwrite = true" in text and "stream=reports" in text
    assert existing_records(path, output) == before


def test_overwrite_opt_in_replaces_the_output(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    path = job_file(tmp_path, JSONL, overwrite=True)
    write_jsonl(tmp_path / "reports", 0, [{"key": "old", "value": 1}] * 5)
    instance = start(path)
    instance.close(commit=True)
    assert read_jsonl(tmp_path / "reports", 0) == []


def test_own_uncommitted_outputs_are_still_rolled_back_after_a_crash(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    path = job_file(tmp_path, JSONL)
    instance = start(path)
    instance.process(Envelope("events", 0, 0, "a", 1))
    instance.commit()
    instance.process(Envelope("events", 0, 1, "b", 2))
    instance.prepare_commit()  # outputs written, checkpoint not: a crash here
    instance.abandon()
    assert len(read_jsonl(tmp_path / "reports", 0)) == 2
    instance = start(path)
    assert [r["key"] for r in read_jsonl(tmp_path / "reports", 0)] == ["a"]
    instance.close(commit=False)


def test_crash_before_the_first_commit_rolls_back_own_outputs(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    path = job_file(tmp_path, JSONL)
    instance = start(path)
    instance.process(Envelope("events", 0, 0, "a", 1))
    instance.prepare_commit()
    instance.abandon()
    instance = start(path)  # the generation checkpoint of the first start covers the output at 0
    assert read_jsonl(tmp_path / "reports", 0) == []
    instance.close(commit=False)


@pytest.mark.parametrize("output_path", ["in", "in/sub", "."], ids=["same", "nested-in-input", "input-inside"])
def test_output_over_an_input_is_refused(tmp_path, monkeypatch, capsys, output_path):
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    write_jsonl(tmp_path / "in", 0, [{"key": "k", "value": i} for i in range(10)])
    before = (tmp_path / "in" / "0.jsonl").read_bytes()
    path = job_file(tmp_path, f'system = "jsonl"\npath = "{output_path}"\n')
    assert main(["validate", str(path)]) == 1
    err = capsys.readouterr().err
    assert "outputs.reports" in err and "input 'events'" in err
    with pytest.raises(ConfigError):
        StreamSink(load_job_config(path))
    assert (tmp_path / "in" / "0.jsonl").read_bytes() == before


def test_output_over_an_input_via_absolute_path_is_refused(tmp_path, monkeypatch, capsys):
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    path = job_file(tmp_path, f'system = "jsonl"\npath = "{tmp_path / "in"}"\n')
    assert main(["validate", str(path)]) == 1
    assert "overwrite its own input" in capsys.readouterr().err


def test_two_outputs_in_one_place_are_refused(tmp_path, monkeypatch, capsys):
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    path = job_file(tmp_path, JSONL + '\n[outputs.copy]\nsystem = "jsonl"\npath = "reports"\n')
    assert main(["validate", str(path)]) == 1
    err = capsys.readouterr().err
    assert "outputs.copy" in err and "where output 'reports' writes" in err


def test_distinct_outputs_validate(tmp_path, monkeypatch, capsys):
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    path = job_file(tmp_path, JSONL)
    (tmp_path / "in").mkdir()  # validate refuses a missing input directory
    assert main(["validate", str(path)]) == 0


def test_output_into_the_jobs_state_or_changelog_is_refused(tmp_path, monkeypatch, capsys):
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    path = job_file(tmp_path, 'system = "file"\npath = "state/changelogs"\nstream = "echo-kv-changelog"\n'
                    '\n[stores.kv]\nengine = "kv"\nbackend = "memory"\n'
                    '\n[outputs.inside]\nsystem = "jsonl"\npath = "state/echo/stores"\n')
    assert main(["validate", str(path)]) == 1
    err = capsys.readouterr().err
    assert "outputs.reports: writes into changelog 'echo-kv-changelog'" in err
    assert "outputs.inside: writes into the job's state directory" in err


@pytest.mark.parametrize("overwrite", [False, True])
def test_symlinked_output_file_is_never_truncated_through(tmp_path, monkeypatch, overwrite):
    from localstate.errors import LocalStateError

    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    victim = tmp_path / "victim.jsonl"
    victim.write_bytes(b'{"key":"x","value":1}\n' * 50)
    (tmp_path / "reports").mkdir()
    (tmp_path / "reports" / "0.jsonl").symlink_to(victim)
    path = job_file(tmp_path, JSONL, overwrite=overwrite)
    with pytest.raises(LocalStateError):  # OutputError (data there), or UnsafePathError (overwrite)
        start(path)
    assert victim.read_bytes() == b'{"key":"x","value":1}\n' * 50
