"""Spark executors use the plugin policy shipped with the job: they never look for plugins.toml,
and a local plugin allowed on the driver loads in the Python workers."""

from __future__ import annotations

import os

import pytest

from localstate.core.config import load_job_config
from localstate.core.policy import ENV_VAR
from localstate.runtime.spark.runner import SparkJobRunner
from counting_job import final_counts, write_counting_job  # tests/ is on sys.path (tests/conftest.py)
from keyed_events import write_keyed_events

pytestmark = pytest.mark.spark

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
    write_keyed_events(job_dir / "data", [f"k{i % 5}" for i in range(40)], partitions=1)
    job_file = write_counting_job(job_dir, "shipped-policy", partitions=1,
                                  store={"engine": "tallied", "backend": "memory"})
    job = load_job_config(job_file)
    # After the driver resolved it, the file turns broken: anyone re-reading it would fail.
    (job_dir / "plugins.toml").write_text("policy = 5\n")
    SparkJobRunner(job, context=spark_context, progress=None).run()

    assert final_counts(job) == {f"k{i}": 8 for i in range(5)}
    creators = {int(p.name.rsplit("-", 1)[1]) for p in markers.iterdir()}
    assert creators - {os.getpid()}, "the store was never created in a Python worker"
