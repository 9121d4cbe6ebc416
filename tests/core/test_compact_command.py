"""`localstate compact`: compacts the committed prefix of each store's file changelog, and a
restore from the compacted changelog gives the same state."""

import shutil
import sys
import textwrap

from localstate.tools.cli import main
from localstate.core.config import load_job_config
from localstate.runtime.layout import open_changelog_system, store_directory
from localstate.runtime.partition.instance import TaskInstance

sys.path.insert(0, __import__("os").path.dirname(__file__))
from test_runtime import Counter  # noqa: E402
from localstate.core.task import Envelope  # noqa: E402


def test_compact_command_keeps_restore_identical(tmp_path, capsys):
    job_file = tmp_path / "job.toml"
    job_file.write_text(textwrap.dedent("""
        [job]
        name = "compactme"
        task = "test_runtime:Counter"
        commit_every = 100
        [changelogs.file]
        segment_bytes = 4096
        [stores.counts]
        engine = "kv"
        backend = "lmdb"
        key_serde = "string"
        value_serde = "int"
    """))
    job = load_job_config(job_file)
    instance = TaskInstance(job, 0, open_changelog_system(job), task_factory=Counter)
    instance.open()
    for i in range(2000):
        instance.process(Envelope("views", 0, i, f"k{i % 10}", i))
    instance.close(commit=True)
    before_records = sum(1 for _ in open_changelog_system(job).reader("compactme-counts-changelog", 0).read())

    assert main(["compact", str(job_file)]) == 0
    printed = capsys.readouterr().out
    assert "compactme-counts-changelog" in printed
    after_records = sum(1 for _ in open_changelog_system(job).reader("compactme-counts-changelog", 0).read())
    assert after_records < before_records

    shutil.rmtree(store_directory(job, "counts", 0))
    instance = TaskInstance(job, 0, open_changelog_system(job), task_factory=Counter)
    instance.open()
    assert dict(instance.stores["counts"].engine.all()) == {f"k{k}": 200 for k in range(10)}
    instance.close(commit=False)
