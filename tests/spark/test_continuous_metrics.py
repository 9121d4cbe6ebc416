"""Per-commit figures of a continuous run on local Spark, as Prometheus serves them: every commit the
partitions made is counted once (the ones their checkpoints show, plus each partition's last, which
its task returned with the epoch), the commit-duration and record-latency histograms are consistent
with those counts, bucket by bucket, and ``localstate status`` shows the last report's figures.

Scraped over real HTTP and parsed with prometheus_client's own text parser."""

from __future__ import annotations

import json
import socket
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from counting_job import write_counting_job  # tests/ is on sys.path (tests/conftest.py)
from keyed_events import write_keyed_events
from localstate.core.commit_stats import BOUNDS_MS, CommitStats
from localstate.core.config import load_job_config
from localstate.runtime.driver.progress import ProgressObserver
from localstate.runtime.layout import checkpoint_store
from localstate.runtime.spark.continuous import ContinuousRunner
from localstate.tools.cli import main

pytestmark = pytest.mark.spark

KEYS = [f"user-{i % 23}" for i in range(1200)]
COMMIT_EVERY = 40  # about 600 records a partition: about 15 commits each, inside the feed's chunks too


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _scrape(port: int) -> dict[str, dict[tuple, float]]:
    """metric family -> {(sample name, sorted labels without ``job``): value}."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    families = {}
    for family in text_string_to_metric_families(text):
        families[family.name] = {(sample.name, tuple(sorted((k, v) for k, v in sample.labels.items() if k != "job"))):
                                 sample.value for sample in family.samples}
    return families


def _buckets(family: dict[tuple, float], name: str) -> list[float]:
    """The cumulative bucket counts of histogram ``name``, in ``le`` order (+Inf last)."""
    by_le = {dict(labels)["le"]: value for (sample, labels), value in family.items() if sample == f"{name}_bucket"}
    return [by_le[le] for le in sorted(by_le, key=float)]


def assert_sum_within_buckets(cumulative: list[float], total_seconds: float) -> None:
    """A histogram's sum lies between what its buckets allow: each count at least its bucket's lower
    bound and at most its upper one (nothing counted above the last bound here)."""
    counts = [b - a for a, b in zip([0.0] + cumulative[:-1], cumulative)]
    assert counts[-1] == 0
    lower = sum(n * bound for n, bound in zip(counts[1:], BOUNDS_MS))
    upper = sum(n * bound for n, bound in zip(counts, BOUNDS_MS))
    assert lower <= total_seconds * 1000 <= upper * (1 + 1e-9), (lower, total_seconds * 1000, upper)


def test_a_continuous_run_counts_every_commit_in_prometheus_and_status(tmp_path, spark_context, capsys):
    port = _free_port()
    job_file = write_counting_job(tmp_path / "job", "continuous-metrics",
                                  job={"metrics_port": port, "commit_every": COMMIT_EVERY})
    job_file.write_text(job_file.read_text() + '\n[spark]\nmode = "continuous"\n')
    write_keyed_events(tmp_path / "job" / "data", KEYS)
    job = load_job_config(job_file)
    runner = ContinuousRunner(job, context=spark_context, progress=None)
    observer = ProgressObserver.watch(runner)
    seen: list[dict] = []
    observer.sinks.append(seen.append)
    try:
        summary = runner.run(until_drained=True)
        scraped = _scrape(port)
    finally:
        observer.close()
    assert summary.records_in == len(KEYS)
    assert all(r.failed_attempts == 0 for r in summary.batches)  # one open per partition

    # What the checkpoints show: each partition's figures of its one open (one epoch: the run drained
    # in it), all its commits but the last (whose figures its task returned with the epoch).
    shown = [checkpoint_store(job).load(partition) for partition in range(job.partitions)]
    stats = [checkpoint.commit_stats for checkpoint in shown]
    assert all(s is not None and s.since == c.generation for s, c in zip(stats, shown)), stats
    assert all(s.commits >= c.inputs["events"] // COMMIT_EVERY - 1 for s, c in zip(stats, shown))
    in_checkpoints = stats[0].plus(stats[1])

    def value(family: str, sample: str, **labels: str) -> float:
        return scraped[family][(sample, tuple(sorted(labels.items())))]

    commits = value("localstate_commits", "localstate_commits_total")
    assert commits == in_checkpoints.commits + job.partitions
    assert value("localstate_commit_duration_seconds", "localstate_commit_duration_seconds_count") == commits
    commit_buckets = _buckets(scraped["localstate_commit_duration_seconds"], "localstate_commit_duration_seconds")
    assert len(commit_buckets) == len(BOUNDS_MS) + 1 and commit_buckets[-1] == commits
    assert commit_buckets == sorted(commit_buckets)  # cumulative
    # Bucket by bucket: the checkpoints' counts, plus one last commit per partition somewhere.
    cumulative, total = [], 0
    for n in in_checkpoints.commit.counts:
        total += n
        cumulative.append(total)
    assert all(0 <= served - shown_ <= job.partitions for served, shown_ in zip(commit_buckets, cumulative))
    commit_sum = value("localstate_commit_duration_seconds", "localstate_commit_duration_seconds_sum")
    assert commit_sum * 1000 >= in_checkpoints.commit.sum_ms > 0
    assert_sum_within_buckets(commit_buckets, commit_sum)

    latencies = value("localstate_record_latency_seconds", "localstate_record_latency_seconds_count")
    assert in_checkpoints.latency.count <= latencies <= in_checkpoints.latency.count + job.partitions
    assert 0 < latencies <= commits
    latency_buckets = _buckets(scraped["localstate_record_latency_seconds"], "localstate_record_latency_seconds")
    assert latency_buckets[-1] == latencies and latency_buckets == sorted(latency_buckets)
    latency_sum = value("localstate_record_latency_seconds", "localstate_record_latency_seconds_sum")
    assert latency_sum * 1000 >= in_checkpoints.latency.sum_ms > 0
    assert_sum_within_buckets(latency_buckets, latency_sum)

    # The progress objects hold the same commits, period by period.
    periods = [CommitStats.from_progress(progress.get("commits")) for progress in seen]
    assert all(period is not None for period in periods)
    assert sum(period.commits for period in periods) == commits
    assert sum(period.latency.count for period in periods) == latencies

    # `localstate status` shows the last report's commits, read from progress.jsonl.
    capsys.readouterr()
    main(["status", str(job_file), "--json"])
    status = json.loads(capsys.readouterr().out)
    last = periods[-1]
    assert status["commits"]["count"] == last.commits
    assert status["commits"]["commit_ms"]["p99"] == last.commit.quantile(0.99)
    main(["status", str(job_file)])
    if last.commits:
        assert "commit(s): commit time mean" in capsys.readouterr().out
