"""A store's options that change how its state is laid out (``ttl`` on a kv store) cannot change
under committed state: the checkpoint records each store's layout (``Checkpoint.formats``, from the
engine's optional ``StateFormat``) and a reopen with another one is a ConfigError at
``stores.<store>``, whether the old state is read from the local store or restored from the
changelog. Checkpoints written before the field existed still open."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from localstate.core.checkpoint import Checkpoint
from localstate.core.config import load_job_config
from localstate.runtime.layout import checkpoint_store, open_changelog_system
from localstate.core.task import Envelope, StreamTask
from localstate.errors import ConfigError
from localstate.runtime.partition.instance import TaskInstance
from toml_tables import toml_text  # tests/ is on sys.path (tests/conftest.py)


class Remember(StreamTask):
    def init(self, context):
        self.seen = context.kv("seen")

    def process(self, envelope, collector, coordinator):
        self.seen.put(envelope.key, envelope.value)


def job_file(tmp_path: Path, backend: str, ttl: str | None) -> Path:
    path = tmp_path / "job.toml"
    path.write_text(toml_text({
        "job": {"name": "formats", "task": "test_state_format:Remember"},
        "inputs.events": {"system": "jsonl", "path": "in"},
        "stores.seen": {"engine": "kv", "backend": backend, "key_serde": "string", "value_serde": "bytes",
                        **({"ttl": ttl} if ttl else {})},
    }))
    return path


def open_instance(path: Path) -> TaskInstance:
    job = load_job_config(path)
    instance = TaskInstance(job, 0, open_changelog_system(job), task_factory=Remember)
    instance.open()
    return instance


def write_some(path: Path) -> None:
    instance = open_instance(path)
    for offset in range(5):
        instance.process(Envelope("events", 0, offset, f"k{offset}", b"value-%d" % offset))
    instance.close(commit=True)


@pytest.fixture(autouse=True)
def _importable(monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).parent))


@pytest.mark.parametrize("backend", ["rocksdb", "lmdb", "memory"])
@pytest.mark.parametrize("local_state", ["kept", "lost"])
def test_removing_ttl_under_committed_state_is_refused(tmp_path, backend, local_state):
    write_some(job_file(tmp_path, backend, "1d"))
    job = load_job_config(tmp_path / "job.toml")
    assert checkpoint_store(job).load(0).formats == {"seen": "kv+ttl"}
    if local_state == "lost":  # the state then comes from the changelog alone
        shutil.rmtree(tmp_path / "state" / "formats" / "stores", ignore_errors=True)
    with pytest.raises(ConfigError) as info:
        open_instance(job_file(tmp_path, backend, None))
    message = str(info.value)
    assert "stores.seen" in message and "'kv+ttl'" in message and "'kv'" in message and "partition 0" in message
    # Nothing was read in the wrong layout or changed: with ttl back, the values are the ones written.
    instance = open_instance(job_file(tmp_path, backend, "1d"))
    assert instance.stores["seen"].engine.get("k3") == b"value-3"
    instance.close(commit=False)


def test_adding_ttl_under_committed_state_is_refused(tmp_path):
    write_some(job_file(tmp_path, "rocksdb", None))
    with pytest.raises(ConfigError, match="stores.seen"):
        open_instance(job_file(tmp_path, "rocksdb", "1d"))


def test_a_checkpoint_without_formats_still_opens_and_then_records_them(tmp_path):
    """Checkpoints written before ``formats`` existed (the field absent) open as they did."""
    path = job_file(tmp_path, "rocksdb", "1d")
    write_some(path)
    job = load_job_config(path)
    where = checkpoint_store(job).path(0)
    data = json.loads(where.read_text())
    del data["formats"]
    where.write_text(json.dumps(data))
    assert Checkpoint.from_json(where.read_text(), str(where)).formats == {}
    instance = open_instance(path)
    assert instance.stores["seen"].engine.get("k1") == b"value-1"
    instance.close(commit=True)
    assert checkpoint_store(job).load(0).formats == {"seen": "kv+ttl"}


def test_a_corrupt_formats_field_is_a_checkpoint_error(tmp_path):
    from localstate.errors import CheckpointError

    with pytest.raises(CheckpointError, match="formats"):
        Checkpoint.from_json(json.dumps({"format": json.loads(Checkpoint(0).to_json())["format"], "partition": 0,
                                         "inputs": {}, "changelogs": {}, "formats": {"seen": 7}}), "x")
