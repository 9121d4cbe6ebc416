"""``job.pipelined_commits``: validated, said to be unused by `localstate run`, and without effect on
changelogs whose flush is durable when it returns (file, memory): their commits stay synchronous,
the checkpoint saved before ``commit()`` returns. (The objectstore side: tests/objectstore/
test_objectstore_pipelined.py.)"""

from __future__ import annotations

import pytest

from localstate.core.changelog import DeferredDurability
from localstate.core.config import load_job_config, parse_job_config
from localstate.runtime.layout import checkpoint_store, open_changelog_system
from localstate.runtime.partition.instance import MemorySink, TaskInstance
from localstate.core.stream import InputRecord
from localstate.core.task import StreamTask
from localstate.tools.validation import spark_notes
from localstate.errors import ConfigError


class Counter(StreamTask):
    def init(self, context):
        self.counts = context.store("counts")

    def process(self, envelope, collector, coordinator):
        self.counts.put(envelope.key, (self.counts.get(envelope.key) or 0) + 1)


def job_table(tmp_path, changelog: str = "file", **job):
    return {"job": {"name": "j", "partitions": 1, "task": "m:T", "changelog": changelog, "state_dir": str(tmp_path),
                    **job},
            "stores": {"counts": {"engine": "kv", "backend": "rocksdb", "key_serde": "string", "value_serde": "int"}}}


@pytest.mark.parametrize("bad", ["yes", 1, 0, "false", [True]])
def test_a_bad_value_is_a_config_error_naming_the_option(tmp_path, bad):
    with pytest.raises(ConfigError) as caught:
        parse_job_config(job_table(tmp_path, pipelined_commits=bad), base_dir=tmp_path)
    (problem,) = [p for p in caught.value.problems if p.path == "job.pipelined_commits"]
    assert "true or false" in problem.message and repr(bad) in problem.message


@pytest.mark.parametrize("value", [True, False])
def test_the_value_is_kept_and_defaults_to_true(tmp_path, value):
    assert parse_job_config(job_table(tmp_path), base_dir=tmp_path).pipelined_commits is True
    assert parse_job_config(job_table(tmp_path, pipelined_commits=value), base_dir=tmp_path).pipelined_commits is value


@pytest.mark.parametrize("changelog", ["file", "memory"])
def test_changelogs_durable_at_flush_keep_synchronous_commits(tmp_path, changelog):
    job = parse_job_config(job_table(tmp_path, changelog, pipelined_commits=True), base_dir=tmp_path)
    system = open_changelog_system(job)
    instance = TaskInstance(job, 0, system, MemorySink(), Counter)
    instance.open()
    assert not isinstance(instance.stores["counts"].changelog, DeferredDurability)
    assert instance.pipelined is False
    instance.feed(("in", InputRecord(i, f"k{i % 5}", None)) for i in range(40))
    instance.commit()
    assert instance.commit_pending is False
    assert checkpoint_store(job).load(0).inputs == {"in": 40}  # saved before commit() returned
    instance.close(commit=False)
    system.close()


def test_localstate_run_says_it_does_not_use_the_option(tmp_path):
    path = tmp_path / "job.toml"
    path.write_text('[job]\nname = "j"\ntask = "m:T"\npipelined_commits = false\n\n'
                    '[stores.counts]\nengine = "kv"\nkey_serde = "string"\nvalue_serde = "int"\n')
    notes = spark_notes(load_job_config(path))
    assert any(note.startswith("job.pipelined_commits: not used by `localstate run`") for note in notes)
