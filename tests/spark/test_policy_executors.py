"""Spark executors use the plugin policy shipped with the job: they never look for plugins.toml,
and a local plugin allowed on the driver loads in the Python workers."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from localstate.core.config import load_job_config
from localstate.core.policy import ENV_VAR
from localstate.core.spark.runner import SparkJobRunner
from localstate.core.streams import open_output
from localstate.streams.jsonl import write_jsonl

pytestmark = pytest.mark.spark

HERE = Path(__file__).resolve().parent

PLUGIN = '''
import os
from pathlib import Path

from localstate.engines.kv import KeyValueEngineFactory


class TalliedFactory(KeyValueEngineFactory):
    """kv, loaded as a [local] plugin; leaves one file per process that created a store."""

    def create(self, context):
        Path({markers!r}, f"created-by-{{os.getpid()}}").touch()
        return super().create(context)
'''


def test_executors_use_the_shipped_policy_not_the_file(tmp_path, spark_context, monkeypatch):
    monkeypatch.delenv(ENV_VAR, raising=False)
    job_dir, markers = tmp_path / "job", tmp_path / "markers"
    (job_dir / "dev").mkdir(parents=True)
    markers.mkdir()
    (job_dir / "dev" / "tallied_engine.py").write_text(PLUGIN.format(markers=str(markers)))
    (job_dir / "plugins.toml").write_text('[policy]\nmode = "allowlist"\nallow_plugins = ["engines.tallied"]\n'
                                          '[local]\npaths = ["dev"]\n[local.engines]\n'
                                          'tallied = "tallied_engine:TalliedFactory"\n')
    keys = [f"k{i % 5}" for i in range(40)]
    write_jsonl(job_dir / "data", 0, [{"key": k, "value": i, "ts": float(i)} for i, k in enumerate(keys)])
    (job_dir / "job.toml").write_text(f"""
[job]
name = "shipped-policy"
partitions = 1
task = "count_task:CountByKey"
state_dir = "state"

[inputs.events]
system = "jsonl"
path = "data"

[outputs.counts-out]
system = "file"
path = "out"

[stores.counts]
engine = "tallied"
backend = "memory"
key_serde = "string"
value_serde = "int"

[spark]
pythonpath = ["{HERE}"]
""")
    job = load_job_config(job_dir / "job.toml")
    # After the driver resolved it, the file turns broken: anyone re-reading it would fail.
    (job_dir / "plugins.toml").write_text("policy = 5\n")
    SparkJobRunner(job, context=spark_context, progress=None).run()

    output = open_output(job, "counts-out")
    final = dict(output.read(0))
    output.close()
    assert final == {f"k{i}": 8 for i in range(5)}
    creators = {int(p.name.rsplit("-", 1)[1]) for p in markers.iterdir()}
    assert creators - {os.getpid()}, "the store was never created in a Python worker"
