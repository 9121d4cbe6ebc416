"""``localstate validate --dry-run N``: the task on the first records of each input partition,
through the same lifecycle as a run, on scratch state. What only the first record would show is
caught at validate, and the job's own state, changelogs and outputs are never touched."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from localstate.tools.cli import main

TASKS = '''
from localstate import StreamTask


class Count(StreamTask):
    def init(self, context):
        self.counts = context.kv("counts")

    def process(self, envelope, collector, coordinator):
        count = (self.counts.get(envelope.key) or 0) + 1
        self.counts.put(envelope.key, count)
        collector.send("out", envelope.key, count)


class FailsOnThird(StreamTask):
    def init(self, context):
        self.seen = 0

    def process(self, envelope, collector, coordinator):
        self.seen += 1
        if self.seen == 3:
            raise KeyError("no such page")  # the user's line


class WrongValue(StreamTask):
    def init(self, context):
        self.counts = context.kv("counts")

    def process(self, envelope, collector, coordinator):
        self.counts.put(envelope.key, {"not": "an int"})
'''


def _job(tmp_path: Path, task: str, *, on_error: str = "fail") -> Path:
    (tmp_path / "dry_tasks.py").write_text(TASKS)
    data = tmp_path / "in"
    data.mkdir()
    for partition in range(2):
        lines = [json.dumps({"key": f"k{i % 3}", "value": i, "ts": 1_700_000_000 + i}) for i in range(20)]
        if partition == 1:
            lines.insert(4, "{not json")
        (data / f"{partition}.jsonl").write_text("\n".join(lines) + "\n")
    (tmp_path / "job.toml").write_text(textwrap.dedent(f"""\
        [job]
        name = "dry"
        partitions = 2
        task = "dry_tasks:{task}"
        state_dir = "state"

        [inputs.events]
        system = "jsonl"
        path = "in"
        on_error = "{on_error}"

        [outputs.out]
        system = "jsonl"
        path = "out"

        [stores.counts]
        engine = "kv"
        backend = "rocksdb"
        key_serde = "string"
        value_serde = "int"
        """))
    return tmp_path / "job.toml"


def test_a_dry_run_reports_each_partition_and_touches_nothing_of_the_job(tmp_path: Path, capsys) -> None:
    job = _job(tmp_path, "Count", on_error="skip")
    assert main(["validate", str(job), "--dry-run", "10"]) == 0
    out = capsys.readouterr().out
    assert "partition 0: 10 record(s) in, outputs out: 10, 0 timer(s) fired" in out
    assert "partition 1: 10 record(s) in (1 bad skipped, 0 dead-lettered), outputs out: 9" in out
    assert "dry run ok" in out
    assert not (tmp_path / "state").exists() and not (tmp_path / "out").exists()


def test_a_task_failing_on_a_record_fails_the_dry_run_with_the_users_frame(tmp_path: Path, capsys) -> None:
    job = _job(tmp_path, "FailsOnThird")
    assert main(["validate", str(job), "--dry-run", "5"]) == 1
    err = capsys.readouterr().err
    assert "KeyError" in err and "dry_tasks.py" in err and "offset=2" in err and "Traceback" not in err
    assert not (tmp_path / "state").exists()


def test_a_value_the_store_cannot_encode_is_caught_at_validate(tmp_path: Path, capsys) -> None:
    job = _job(tmp_path, "WrongValue")
    assert main(["validate", str(job)]) == 0  # the config alone is fine
    assert main(["validate", str(job), "--dry-run", "1"]) == 1
    err = capsys.readouterr().err
    assert "counts" in err and "int" in err


def test_a_bad_record_with_on_error_fail_is_the_inputs_error(tmp_path: Path, capsys) -> None:
    job = _job(tmp_path, "Count")
    assert main(["validate", str(job), "--dry-run", "10"]) == 1
    err = capsys.readouterr().err
    assert "bad input record" in err and "partition=1, offset=4" in err


@pytest.mark.parametrize("value", ["0", "-1", "x", "1.5"])
def test_dry_run_counts_are_usage_errors(tmp_path: Path, value: str) -> None:
    with pytest.raises(SystemExit) as caught:
        main(["validate", str(tmp_path / "job.toml"), "--dry-run", value])
    assert caught.value.code == 2
