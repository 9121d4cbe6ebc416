"""`localstate inspect` on the non-kv engines: a search (tantivy) store's documents and a sketch
store's changelog, dumped from the changelog replayed to the checkpoint, without changing anything."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from localstate.tools.cli import main
from localstate.core.config import load_job_config
from localstate.runtime.layout import open_changelog_system
from localstate.runtime.partition.instance import TaskInstance
from localstate.core.task import Envelope, StreamTask

JOB = """
[job]
name = "engines"
partitions = 1
task = "unused:Task"

[stores.docs]
engine = "search"
key_serde = "string"
writer_memory = "32MB"
default_fields = ["title"]
fields.title = { type = "text", stored = true }
fields.price = { type = "int", stored = true }

[stores.visitors]
engine = "sketch"
kind = "hll"
precision = 10
key_serde = "string"
"""


class Index(StreamTask):
    def init(self, context):
        self.docs, self.visitors = context.store("docs"), context.store("visitors")

    def process(self, envelope, collector, coordinator):
        if envelope.value is None:
            self.docs.delete(envelope.key)
        else:
            self.docs.add(envelope.key, envelope.value)
            self.visitors.add("all", envelope.key)


def _snapshot(directory: Path) -> dict:
    out = {}
    for folder, dirs, files in os.walk(directory):
        for name in dirs + files:
            path = Path(folder) / name
            stat = os.lstat(path)
            out[str(path)] = (stat.st_mtime_ns, stat.st_size,
                              hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None)
    return out


def test_search_and_sketch_stores(tmp_path, capsys):
    job_file = tmp_path / "job.toml"
    job_file.write_text(JOB)
    job = load_job_config(job_file)
    system = open_changelog_system(job)
    instance = TaskInstance(job, 0, system, task_factory=Index)
    instance.open()
    records = [(f"doc-{i}", {"title": f"red chair {i}", "price": 10 * i}) for i in range(6)] + [("doc-2", None)]
    for offset, (key, value) in enumerate(records):
        instance.process(Envelope("in", 0, offset, key, value))
    instance.commit()
    instance.process(Envelope("in", 0, len(records), "doc-9", {"title": "uncommitted", "price": 1}))
    instance.prepare_commit()          # flushed, never checkpointed: not part of the committed state
    instance.abandon()
    system.close()
    expected = {f"doc-{i}": {"title": f"red chair {i}", "price": 10 * i} for i in range(6) if i != 2}

    state = tmp_path / "state"
    before = _snapshot(state)
    assert main(["inspect", str(job_file), "--store", "docs", "--json", "--limit", "0"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert {row["key"]: row["value"] for row in rows} == expected

    assert main(["inspect", str(job_file), "--store", "visitors", "--json", "--limit", "0"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert rows and all(set(row) == {"partition", "key", "value"} for row in rows)

    assert main(["inspect", str(job_file), "--json"]) == 0
    view = json.loads(capsys.readouterr().out)
    docs = next(row for row in view["stores"] if row["store"] == "docs")
    assert docs["engine"] == "search" and docs["exists"] and docs["bytes"] > 0
    assert docs["changelog_end"] > docs["checkpoint_offset"] == view["checkpoints"]["0"]["changelogs"]["docs"]
    assert main(["inspect", str(job_file), "--changelog", "docs", "--records", "3"]) == 0
    assert "red chair 0" in capsys.readouterr().out
    assert _snapshot(state) == before
