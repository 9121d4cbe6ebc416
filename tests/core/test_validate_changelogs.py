"""`localstate validate` refuses what the run would refuse (issue #37): two stores sharing one
changelog stream, and a store whose changelog is one of the job's inputs (a Kafka changelog topic
named like an input topic, or a changelog directory an input reads). Checked from the configuration
alone: no broker is contacted."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from localstate.core.config import load_job_config, parse_job_config
from localstate.tools.validation import changelog_input_problems, check_job, require_valid
from localstate.errors import ConfigError

TASK = ("from localstate import StreamTask\n\nclass T(StreamTask):\n"
        "    def process(self, envelope, collector, coordinator):\n        pass\n")


def _job(tmp_path: Path, text: str) -> Path:
    (tmp_path / "t.py").write_text(TASK)
    job = tmp_path / "job.toml"
    job.write_text(textwrap.dedent(text))
    return job


def test_two_stores_sharing_one_changelog_are_a_config_error_at_each_store():
    data = {"job": {"name": "j", "task": "t:T"},
            "stores": {"a": {"engine": "kv", "backend": "memory", "changelog": "shared"},
                       "b": {"engine": "kv", "backend": "memory", "changelog": "shared"},
                       "c": {"engine": "kv", "backend": "memory"},
                       "d": {"engine": "kv", "backend": "memory", "changelog": False}}}
    with pytest.raises(ConfigError) as info:
        parse_job_config(data)
    problems = {p.path: p.message for p in info.value.problems}
    assert sorted(problems) == ["stores.a.changelog", "stores.b.changelog"]
    assert "'shared'" in problems["stores.a.changelog"] and "store 'b'" in problems["stores.a.changelog"]
    assert "store 'a'" in problems["stores.b.changelog"]


def test_a_named_changelog_taking_another_stores_default_name_is_refused():
    data = {"job": {"name": "j", "task": "t:T"},
            "stores": {"counts": {"engine": "kv", "backend": "memory"},
                       "other": {"engine": "kv", "backend": "memory", "changelog": "j-counts-changelog"}}}
    with pytest.raises(ConfigError) as info:
        parse_job_config(data)
    assert sorted(p.path for p in info.value.problems) == ["stores.counts.changelog", "stores.other.changelog"]


def test_validate_cli_reports_a_shared_changelog_with_the_store_names(tmp_path):
    job = _job(tmp_path, """
        [job]
        name = "j"
        task = "t:T"
        [stores.first]
        engine = "kv"
        backend = "memory"
        changelog = "log"
        [stores.second]
        engine = "heap"
        changelog = "log"
    """)
    result = subprocess.run([sys.executable, "-m", "localstate", "validate", str(job)], capture_output=True,
                            text=True, cwd=tmp_path)
    assert result.returncode == 1, result.stdout
    assert "  - stores.first.changelog: changelog stream 'log' is also the changelog of store 'second'" in result.stderr
    assert "  - stores.second.changelog: changelog stream 'log' is also the changelog of store 'first'" in result.stderr


KAFKA_JOB = """
    [job]
    name = "clicks"
    task = "t:T"
    changelog = "kafka"
    [changelogs.kafka]
    bootstrap_servers = "127.0.0.1:1"      # nothing listens: validation must not connect
    {prefix}
    [inputs.page-views]
    system = "kafka"
    [inputs.orders]
    system = "kafka"
    topic = "orders-v2"
    [stores.counts]
    engine = "kv"
    backend = "memory"
    changelog = "page-views"
    [stores.totals]
    engine = "kv"
    backend = "memory"
    changelog = "v2"
    [stores.fine]
    engine = "kv"
    backend = "memory"
"""


def test_a_kafka_changelog_named_like_an_input_topic_is_refused_by_validate(tmp_path):
    job = _job(tmp_path, KAFKA_JOB.format(prefix=""))
    check = check_job(job)
    problems = {p.path: p.message for p in check.problems}
    assert list(problems) == ["stores.counts.changelog"]
    assert "Kafka topic 'page-views', where input 'page-views' reads" in problems["stores.counts.changelog"]


def test_the_topic_prefix_counts_both_ways(tmp_path):
    # With topic_prefix "orders-", changelog "v2" is topic "orders-v2": input orders' topic; "page-views"
    # becomes "orders-page-views", which no input reads.
    job = _job(tmp_path, KAFKA_JOB.format(prefix='topic_prefix = "orders-"'))
    problems = {p.path: p.message for p in check_job(job).problems}
    assert list(problems) == ["stores.totals.changelog"]
    assert "Kafka topic 'orders-v2', where input 'orders' reads" in problems["stores.totals.changelog"]


def test_run_refuses_a_changelog_that_is_an_input_before_starting_anything(tmp_path):
    # `localstate run` validates as `validate` does (require_valid) before it starts Spark
    with pytest.raises(ConfigError) as info:
        require_valid(_job(tmp_path, KAFKA_JOB.format(prefix="")))
    assert "stores.counts.changelog" in [p.path for p in info.value.problems]


def test_a_file_changelog_directory_read_by_an_input_is_refused(tmp_path):
    job = _job(tmp_path, """
        [job]
        name = "j"
        task = "t:T"
        state_dir = "state"
        [inputs.replay]
        system = "jsonl"
        path = "state/changelogs/counts-log"
        [stores.counts]
        engine = "kv"
        backend = "memory"
        changelog = "counts-log"
    """)
    (tmp_path / "state" / "changelogs" / "counts-log").mkdir(parents=True)
    config = load_job_config(job)
    problems = changelog_input_problems(config)
    assert [p.path for p in problems] == ["stores.counts.changelog"], problems
    assert "where input 'replay' reads" in problems[0].message
