"""`localstate inspect` and the state reader's shared views on a kv store with ttl: values shown
without their expiry (from local state, from the changelog up to the checkpoint, in a changelog
record dump) and expired entries never shown (docs/time/ttl.md)."""

from __future__ import annotations

import json
import time
from pathlib import Path

from localstate.core.config import load_job_config
from localstate.runtime.layout import open_changelog_system
from localstate.core.task import Envelope, StreamTask
from localstate.engines.kv.ttl import EXPIRY
from localstate.runtime.partition.instance import TaskInstance
from localstate.runtime.driver.views import live_filter, store_entries, load_checkpoints, value_splitter
from localstate.tools.cli import main

JOB = """
[job]
name = "sessions"
partitions = 1
task = "unused:Task"

[stores.sessions]
engine = "kv"
key_serde = "string"
value_serde = "json"
ttl = "7d"

[stores.plain]
engine = "kv"
key_serde = "string"
value_serde = "json"
"""


class Remember(StreamTask):
    def init(self, context):
        self.sessions, self.plain = context.kv("sessions"), context.kv("plain")

    def process(self, envelope, collector, coordinator):
        self.sessions.put(envelope.key, envelope.value)
        self.plain.put(envelope.key, envelope.value)


def _run_job(tmp_path: Path) -> Path:
    job_file = tmp_path / "job.toml"
    job_file.write_text(JOB)
    job = load_job_config(job_file)
    system = open_changelog_system(job)
    instance = TaskInstance(job, 0, system, task_factory=Remember)
    instance.open()
    for offset, key in enumerate(["a", "b", "c"]):
        instance.process(Envelope("in", 0, offset, key, {"user": key}))
    instance.commit()
    instance.abandon()
    system.close()
    return job_file


def test_inspect_shows_ttl_values_without_their_expiry(tmp_path, capsys):
    job_file = _run_job(tmp_path)
    expected = {key: {"user": key} for key in "abc"}
    for source in ([], ["--from-changelog"]):
        assert main(["inspect", str(job_file), "--store", "sessions", "--json", "--limit", "0", *source]) == 0
        rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
        assert {row["key"]: row["value"] for row in rows} == expected, source
    assert main(["inspect", str(job_file), "--changelog", "sessions", "--records", "10", "--json"]) == 0
    [dump] = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [record["value"] for record in dump["records"]] == [{"user": key} for key in "abc"]
    week = 7 * 86400
    # a ttl of an hour or more keeps whole-second expiries, rounded up
    assert all(0 < record["expires"] - time.time() <= week + 1 for record in dump["records"])
    assert all(float(record["expires"]).is_integer() for record in dump["records"])
    assert main(["inspect", str(job_file), "--changelog", "plain", "--records", "10", "--json"]) == 0
    [dump] = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert all("expires" not in record for record in dump["records"])


def test_the_views_hide_expired_entries(tmp_path):
    job = load_job_config(_run_job(tmp_path))
    checkpoints = load_checkpoints(job)
    live = live_filter(job, job.stores["sessions"], checkpoints[0])
    assert live is not None and live_filter(job, job.stores["plain"], checkpoints[0]) is None
    stored = [(b"gone", EXPIRY.pack(1_000.0) + b'"x"'), (b"kept", EXPIRY.pack(time.time() + 3600) + b'"y"')]
    assert list(live(stored)) == [(b"kept", b'"y"')]
    split = value_splitter(job, job.stores["sessions"])
    assert split is not None and split(stored[0][1]) == (b'"x"', 1_000.0)
    assert value_splitter(job, job.stores["plain"]) is None
    for from_changelog in (False, True):
        entries = store_entries(job, "sessions", checkpoints, from_changelog=from_changelog)
        assert {entry.key: entry.value for entry in entries} == {key: {"user": key} for key in "abc"}


def test_the_state_reader_views_show_values_without_their_expiry(tmp_path):
    """The state reader's rows (its views run here without a Spark session: the same code its tasks
    run): the committed state and the change feed of a ttl store decode as a plain store's do."""
    from localstate.runtime.spark.state_source import ReadOptions, load_view

    job_file = _run_job(tmp_path)
    rows = {}
    for store in ("sessions", "plain"):
        for feed in (False, True):
            options = {"job": str(job_file), "store": store}
            if feed:
                options.update(view="changelog", readChangeFeed="true")
            view, _ = load_view(ReadOptions.parse(options))
            rows[store, feed] = [row for piece in view.slices() for row in view.rows(piece)]
    for feed in (False, True):
        assert rows["sessions", feed] == rows["plain", feed]
    assert sorted(row[1] for row in rows["sessions", False]) == ["a", "b", "c"]
    assert [json.loads(row[3]) for row in rows["sessions", True]] == [{"user": key} for key in "abc"]
