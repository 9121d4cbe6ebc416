"""The per-commit figures a partition carries in its checkpoints (:mod:`localstate.core.commit_stats`):
what a task counts (every commit, a latency for each commit that carried records, one commit late in
its checkpoints), how the driver takes the difference between two looks (a reopened partition's
figures start over), and that a damaged or hostile value reads as absent, wherever it is read: a
checkpoint, a progress object, the metrics. A checkpoint written before the field loads unchanged."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from localstate import StreamTask
from localstate.core.checkpoint import Checkpoint
from localstate.core.commit_stats import BOUNDS_MS, COUNT_LIMIT, CommitStats, Histogram, bucket_of
from localstate.runtime.driver.metrics import METRICS, JobMetrics
from localstate.testing.driver import TaskTestDriver

STORES = {"counts": {"engine": "kv", "key_serde": "string", "value_serde": "int"}}
BUCKETS = len(BOUNDS_MS) + 1


class Counting(StreamTask):
    def init(self, context):
        self.counts = context.store("counts")

    def process(self, envelope, collector, coordinator):
        self.counts.put(envelope.key, (self.counts.get(envelope.key) or 0) + 1)
        collector.send("out", envelope.key, 1)


def _rows(n, start=0):
    return [("views", f"k{i % 3}", i, None) for i in range(start, start + n)]


def _stats(since=1, commits=(), latencies=()) -> CommitStats:
    commit, latency = Histogram(), Histogram()
    for ms in commits:
        commit = commit.observe(ms)
    for ms in latencies:
        latency = latency.observe(ms)
    return CommitStats(since, commit, latency)


# -- what a task counts --------------------------------------------------------------------------
def test_every_commit_is_counted_and_reaches_the_next_checkpoint():
    with TaskTestDriver(Counting, stores=STORES, commit_every=10) as driver:
        instance = driver.instances[0]
        driver.send_rows(_rows(35), partition=0)  # one feed: commits after records 10, 20, 30, inside one chunk
        accounting = instance.committer.accounting
        assert instance.committer.commits == 3
        assert accounting.stats.commits == 3 and accounting.stats.since == instance.generation
        # Each commit carried records, the two after a commit inside the chunk too (read in the same pull).
        assert accounting.stats.latency.count == 3
        saved = instance.checkpoints.load(0).commit_stats
        assert saved is not None and saved.commits == 2 and saved.since == instance.generation  # one late
        assert saved.commit.counts == CommitStats.parse(saved.to_json()).commit.counts
        # Each commit's oldest record was read before the commit began: it waited at least the commit.
        assert accounting.stats.latency.sum_ms >= accounting.stats.commit.sum_ms > 0

        driver.commit()  # the 5 records left
        driver.commit()  # nothing new: a commit, no latency
        assert accounting.stats.commits == 5 and accounting.stats.latency.count == 4
        assert instance.checkpoints.load(0).commit_stats.commits == 4


def test_a_reopened_partition_starts_its_figures_over_and_the_driver_sees_only_the_new_commits():
    with TaskTestDriver(Counting, stores=STORES, commit_every=5) as driver:
        instance = driver.instances[0]
        driver.send_rows(_rows(20), partition=0)
        before = instance.checkpoints.load(0).commit_stats
        assert before is not None and before.commits == 3
        driver.restart()  # the partition reopens: a new generation, figures from zero
        instance = driver.instances[0]
        assert instance.checkpoints.load(0).commit_stats is None  # the open's checkpoint has none
        driver.send_rows(_rows(10, start=20), partition=0)
        after = instance.checkpoints.load(0).commit_stats
        assert after.since == instance.generation > before.since
        assert after.commits == 1  # 2 commits, the last one late
        # The driver's difference across the reopen: the new open's commits, never a negative count.
        assert after.since_last(before) == after
        assert after.since_last(after).commits == 0


# -- the driver's difference -----------------------------------------------------------------------
def test_since_last_takes_the_difference_within_one_open():
    earlier = _stats(3, [1.0, 4.0], [2.0])
    later = _stats(3, [1.0, 4.0, 0.3, 70.0], [2.0, 90.0])
    diff = later.since_last(earlier)
    assert diff.commits == 2 and diff.latency.count == 1
    assert diff.commit.counts[bucket_of(0.3)] == 1 and diff.commit.counts[bucket_of(70.0)] == 1
    assert diff.commit.sum_ms == pytest.approx(70.3) and diff.latency.sum_ms == pytest.approx(90.0)


@pytest.mark.parametrize("earlier", [None, _stats(2, [1.0] * 9), _stats(3, [1.0] * 9)])
def test_since_last_counts_everything_when_the_figures_started_over(earlier):
    # None: never seen; another generation; the same one with counts gone down (started over)
    later = _stats(3, [1.0, 1.0], [5.0])
    assert later.since_last(earlier) == later


def test_buckets_follow_prometheus_le():
    assert bucket_of(BOUNDS_MS[0]) == 0 and bucket_of(BOUNDS_MS[0] + 1e-9) == 1
    assert bucket_of(math.inf) == len(BOUNDS_MS) and bucket_of(0.0) == 0
    stats = _stats(1, [0.1, 3.0, 3.0, 4.0, 1e9])
    assert stats.commit.quantile(0.5) == 5.0 and stats.commit.quantile(0.99) == math.inf
    assert stats.commit.quantile(0.2) == 0.25 and Histogram().quantile(0.5) is None


# -- hostile values ----------------------------------------------------------------------------------
SOUND = _stats(4, [1.0, 2.0], [3.0]).to_json()


def _with(path, value):
    data = json.loads(json.dumps(SOUND))
    target = data
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return data


HOSTILE = [
    None, 7, "x", [], {}, {**SOUND, "extra": 1}, {k: v for k, v in SOUND.items() if k != "since"},
    _with(["since"], -1), _with(["since"], 1 << 63), _with(["since"], True), _with(["since"], 1.0),
    _with(["commit_ms", "counts"], [0] * (BUCKETS - 1)), _with(["commit_ms", "counts"], [0] * (BUCKETS + 1)),
    _with(["commit_ms", "counts"], [-1] + [0] * (BUCKETS - 1)),
    _with(["commit_ms", "counts"], [COUNT_LIMIT + 1] + [0] * (BUCKETS - 1)),
    _with(["commit_ms", "counts"], [1.5] + [0] * (BUCKETS - 1)),
    _with(["commit_ms", "counts"], [True] + [0] * (BUCKETS - 1)),
    _with(["commit_ms", "counts"], ["1"] + [0] * (BUCKETS - 1)),
    _with(["commit_ms", "counts"], {"0": 1}),
    _with(["commit_ms", "sum_ms"], float("nan")), _with(["commit_ms", "sum_ms"], float("inf")),
    _with(["commit_ms", "sum_ms"], -0.5), _with(["commit_ms", "sum_ms"], 1e300), _with(["commit_ms", "sum_ms"], "1"),
    _with(["latency_ms"], None),
    _with(["latency_ms", "counts"], [9] + [0] * (BUCKETS - 1)),  # more latencies than commits
]


@pytest.mark.parametrize("value", HOSTILE)
def test_a_hostile_value_reads_as_absent_and_the_checkpoint_stays_sound(value):
    assert CommitStats.parse(value) is None
    sound = Checkpoint(2, generation=4, inputs={"views": 10}, changelogs={"counts": 5}, outputs={"out": 3})
    data = json.loads(sound.to_json())
    data["commit_stats"] = value
    text = json.dumps(data)  # NaN and infinity as JSON's NaN / Infinity, which json.loads reads
    loaded = Checkpoint.from_json(text, "p/2.json")
    assert loaded.commit_stats is None and loaded == sound  # every other field as it was


def test_a_sound_value_round_trips_through_a_checkpoint():
    checkpoint = Checkpoint(0, generation=4, inputs={"views": 1}, changelogs={}, commit_stats=CommitStats.parse(SOUND))
    assert Checkpoint.from_json(checkpoint.to_json(), "p/0.json") == checkpoint
    assert json.loads(checkpoint.to_json())["commit_stats"] == SOUND


def test_a_checkpoint_written_before_the_field_loads_and_saves_unchanged():
    old = '{"changelogs": {"counts": 12}, "format": 1, "generation": 3, "inputs": {"views": 40}, ' \
          '"outputs": {"out": 40}, "partition": 1}'
    loaded = Checkpoint.from_json(old, "p/1.json")
    assert loaded.commit_stats is None and loaded.inputs == {"views": 40}
    assert loaded.to_json() == old  # written again as it was: no new key


@pytest.mark.parametrize("value", HOSTILE + [{"count": 2, "le_ms": [1.0], "commit_ms": SOUND["commit_ms"],
                                              "latency_ms": SOUND["latency_ms"]},
                                             {"count": 3, "le_ms": list(BOUNDS_MS), "commit_ms": SOUND["commit_ms"],
                                              "latency_ms": SOUND["latency_ms"]}])
def test_the_metrics_take_a_hostile_progress_commits_value_as_absent(value):
    metrics = JobMetrics("j")
    metrics.observe({"commits": value, "state": {"commit_ms": 2.0}})  # read as a micro-batch: one commit
    assert metrics.metrics["localstate_commit_duration_seconds"].buckets.count == 1
    assert metrics.metrics["localstate_record_latency_seconds"].buckets.count == 0
    assert metrics.registry.get_sample_value("localstate_commits_total", {"job": "j"}) == 1


def test_the_metrics_add_a_period_of_commits_at_once():
    period = _stats(0, [0.3, 2.0, 2.0, 40.0], [3.0, 3.0, 100.0])
    metrics = JobMetrics("j")
    metrics.observe({"commits": period.to_progress(), "state": {"commit_ms": 11.0}})
    metrics.observe({"commits": period.to_progress(), "state": {"commit_ms": 11.0}})
    value = metrics.registry.get_sample_value
    assert value("localstate_commits_total", {"job": "j"}) == 8
    assert value("localstate_commit_duration_seconds_count", {"job": "j"}) == 8
    assert value("localstate_commit_duration_seconds_bucket", {"job": "j", "le": "0.0025"}) == 6
    assert value("localstate_commit_duration_seconds_sum", {"job": "j"}) == pytest.approx(2 * 44.3 / 1000)
    assert value("localstate_record_latency_seconds_bucket", {"job": "j", "le": "0.005"}) == 4
    assert value("localstate_record_latency_seconds_bucket", {"job": "j", "le": "+Inf"}) == 6


def test_every_metric_is_in_the_operations_table():
    text = (Path(__file__).resolve().parents[2] / "docs" / "operations.md").read_text(encoding="utf-8")
    missing = [name for name in METRICS if f"| `{name}` |" not in text]
    assert not missing, missing


@pytest.mark.parametrize("value", HOSTILE)
def test_status_reads_a_hostile_commits_value_as_absent(value):
    from localstate.tools.status import commit_summary

    assert commit_summary({"commits": value}) is None
    assert commit_summary(value) is None


def test_status_summarises_the_last_reports_commits():
    from localstate.tools.status import commit_summary

    period = _stats(0, [0.3, 2.0, 2.0, 40.0], [3.0, 3.0, 1e9])
    summary = commit_summary({"commits": period.to_progress()})
    assert summary["count"] == 4
    assert summary["commit_ms"] == {"count": 4, "mean": 11.075, "p50": 2.5, "p99": 50.0}
    assert summary["latency_ms"]["p50"] == 5.0 and summary["latency_ms"]["p99"] == math.inf  # above the last bound
