"""``localstate inspect``, ``compact`` and ``reset`` on a job whose changelogs and checkpoints live in
shared storage (the ``objectstore`` system): inspect reads the committed chains the checkpoints name,
compact collects garbage, reset deletes the job's objects and nothing else."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any


from localstate.tools.cli import main
from localstate.core.config import load_job_config
from localstate.runtime.layout import checkpoint_store, open_changelog_system
from localstate.runtime.partition.instance import MemorySink, TaskInstance
from localstate.core.stream import InputRecord
from localstate.core.task import StreamTask


class Counter_(StreamTask):
    def init(self, context):
        self.counts = context.store("counts")

    def process(self, envelope, collector, coordinator):
        self.counts.put(envelope.key, (self.counts.get(envelope.key) or 0) + 1)


def job_toml(tmp_path: Path, options: dict[str, Any]) -> Path:
    lines = "\n".join(f"{k} = {json.dumps(v)}" for k, v in options.items())
    (tmp_path / "job.toml").write_text(f"""
[job]
name = "shared-counts"
partitions = 2
task = "unused:Unused"
state_dir = "state"
changelog = "objectstore"
commit_interval = 1000000000

[changelogs.objectstore]
{lines}

[stores.counts]
engine = "kv"
key_serde = "string"
value_serde = "int"
""")
    return tmp_path / "job.toml"


def run_job(path: Path, keys: list[str], rounds: int) -> dict[str, int]:
    from localstate.core.partitioner import partition_for

    job = load_job_config(path)
    system = open_changelog_system(job)
    for partition in range(2):
        instance = TaskInstance(job, partition, system, MemorySink(), Counter_)
        instance.open()
        mine = [k for k in keys if partition_for(k, 2) == partition]
        for _ in range(rounds):
            start = instance.position("in")
            instance.feed(("in", InputRecord(start + i, k, 1, 0.0)) for i, k in enumerate(mine))
            instance.commit()
            instance.stores["counts"].changelog.wait_for_snapshot()
        instance.close()
    system.close()
    return {k: v * rounds for k, v in Counter(keys).items()}


def inspect(capsys, *args: str) -> str:
    capsys.readouterr()
    assert main(["inspect", *args]) == 0
    return capsys.readouterr().out


def test_inspect_reads_checkpoints_and_chains_from_shared_storage(objectstore_options, tmp_path, capsys):
    path = job_toml(tmp_path, {**objectstore_options, "snapshot_every": 2})
    expected = run_job(path, [f"u{i % 9}" for i in range(60)], rounds=5)
    overview = json.loads(inspect(capsys, str(path), "--json"))
    manifests = [overview["checkpoints"][str(p)]["manifests"]["counts"] for p in range(2)]
    assert all(m["snapshot"] is not None for m in manifests)
    text = inspect(capsys, str(path))
    assert "checkpoints and changelogs in shared storage" in text and "snapshot up to" in text
    # Without local stores, --from-changelog replays the committed chain: exactly the counts.
    entries = [json.loads(line) for line in inspect(capsys, str(path), "--store", "counts", "--from-changelog",
                                                   "--limit", "0", "--json").splitlines()]
    assert {e["key"]: e["value"] for e in entries} == expected
    changelog = [json.loads(line) for line in inspect(capsys, str(path), "--changelog", "counts",
                                                     "--json").splitlines()]
    for info in changelog:
        assert info["exists"] and info["end"] == info["checkpoint"]
        assert info["segments"][0]["name"].endswith(".snapshot")
        assert all(s["name"].endswith(".delta") for s in info["segments"][1:])


def test_compact_collects_garbage_and_reset_deletes_the_objects(objectstore_options, tmp_path, capsys):
    path = job_toml(tmp_path, {**objectstore_options, "snapshot_every": 2, "gc_keep": 1})
    expected = run_job(path, [f"u{i % 9}" for i in range(60)], rounds=6)
    # Collect with no grace period (the writers above used the default: snapshots must be named
    # within half of it).
    job_toml(tmp_path, {**objectstore_options, "snapshot_every": 2, "gc_keep": 1, "gc_grace": 0})
    job = load_job_config(path)
    system = open_changelog_system(job)
    stream = "shared-counts-counts-changelog"
    before = sum(len(system.objects(stream, p)) for p in range(2))
    assert main(["compact", str(path)]) == 0
    after = sum(len(system.objects(stream, p)) for p in range(2))
    named = sum(len(system.manifest_objects(checkpoint_store(job).load(p).manifests["counts"])) for p in range(2))
    assert after == named < before
    entries = [json.loads(line) for line in inspect(capsys, str(path), "--store", "counts", "--from-changelog",
                                                   "--limit", "0", "--json").splitlines()]
    assert {e["key"]: e["value"] for e in entries} == expected
    system.store.put("changelogs/operator-notes.txt", b"keep me")
    assert main(["reset", str(path), "--yes"]) == 0
    assert all(system.objects(stream, p) == [] for p in range(2))
    assert checkpoint_store(job).load(0) is None
    assert system.store.get("changelogs/operator-notes.txt") == b"keep me"
