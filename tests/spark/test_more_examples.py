"""The sketch and search examples end to end on local Spark (``examples/distinct_counts`` and
``examples/search_index``), each checked against an independent plain-Python computation over
the same input: the generator's records, or the files ``make_input.py`` wrote."""

from __future__ import annotations

import math
import re
import runpy
import shutil
from pathlib import Path
from typing import Any

import pytest
from datasketch import HyperLogLog as ReferenceHLL

from localstate.core.config import JobConfig, load_job_config
from localstate.runtime.layout import open_changelog_system
from localstate.runtime.spark.runner import SparkJobRunner
from localstate.core.stream import open_output
from localstate.streams.jsonl import read_jsonl
from localstate.core.stream import resolve_path
from localstate.streams.generator import generate
from localstate.engines.sketch.keys import split_key

from .test_spark_runtime import EXAMPLES

pytestmark = pytest.mark.spark


def prepare(tmp_path: Path, name: str) -> tuple[JobConfig, dict[str, Any]]:
    """Copy the example's folder (without a local run's files), write its input if it has a
    ``make_input.py``, and load its job config and task module."""
    shutil.copytree(EXAMPLES / name, tmp_path / "job",
                    ignore=shutil.ignore_patterns(".work", "data", "state", "out", "__pycache__"))
    if (tmp_path / "job" / "make_input.py").exists():
        runpy.run_path(str(tmp_path / "job" / "make_input.py"))["write_input"](tmp_path / "job" / "job.toml")
    module = runpy.run_path(str(tmp_path / "job" / f"{name}.py"))
    return load_job_config(tmp_path / "job" / "job.toml"), module


def output_rows(job: JobConfig, stream: str, partition: int) -> list[tuple[Any, Any]]:
    output = open_output(job, stream)
    try:
        return list(output.read(partition))
    finally:
        output.close()


def generated(job: JobConfig, stream: str, partition: int) -> list[tuple[int, Any, dict[str, Any]]]:
    o = job.inputs[stream].options
    return list(generate(o["kind"], o["seed"], job.partitions, partition, o["users"], float(o["rate"]),
                         float(o["start_ts"]), 0, o["events"]))


def reference_estimate(users: set[str], precision: int) -> int:
    """datasketch's own HyperLogLog over the same users (the sketch store documents identical
    registers for ``hash = "datasketch"``), rounded like the job rounds."""
    hll = ReferenceHLL(p=precision)
    for user in sorted(users):
        hll.update(user.encode("utf-8"))
    return round(hll.count())


def test_distinct_counts_example(tmp_path: Path, spark_context: Any) -> None:
    job, module = prepare(tmp_path, "distinct_counts")
    hour_len = module["HOUR"]
    options = job.stores["visitors"].options
    assert options["kind"] == "hll" and options["hash"] == "datasketch"
    precision = options["precision"]
    m = 1 << precision
    se = 1.04 / math.sqrt(m)  # the documented relative standard error
    summary = SparkJobRunner(job, context=spark_context, batch_size=9000, progress=None).run()
    assert summary.records_in == job.partitions * job.inputs["page_views"].options["events"]
    assert summary.lag == 0 and len(summary.batches) >= 3  # hours close in later batches than they open

    global_users: dict[int, set[str]] = {}
    hourly_emitted = []
    changelogs = open_changelog_system(job)
    for partition in range(job.partitions):
        # Independent: the exact sets of users per (page, hour) and per hour, straight from the generator.
        by_page: dict[tuple[str, int], set[str]] = {}
        by_hour: dict[int, set[str]] = {}
        rows = generated(job, "page_views", partition)
        for _, user, value in rows:
            hour = int(value["ts"] // hour_len)
            by_page.setdefault((value["page"], hour), set()).add(user)
            by_hour.setdefault(hour, set()).add(user)
            global_users.setdefault(hour, set()).add(user)
        open_hour = int(rows[-1][2]["ts"] // hour_len)  # never closed: not emitted

        pages = output_rows(job, "page-visitors", partition)
        keys = [(page, value["hour"]) for page, value in pages]
        assert len(keys) == len(set(keys)), f"partition {partition}: a (page, hour) was emitted twice"
        assert set(keys) == {key for key in by_page if key[1] != open_hour}
        inexact = 0
        for page, value in pages:
            users = by_page[(page, value["hour"])]
            n = len(users)
            # Exactly what datasketch estimates for exactly these users: no view lost, none from
            # another hour or page.
            assert value["visitors"] == reference_estimate(users, precision), (page, value)
            # Accuracy: 3 standard errors, plus 2 users because at these small counts (~15) the
            # estimator is linear counting over occupied registers, and a user whose register was
            # already taken is missed: not exact, even for tiny counts.
            assert abs(value["visitors"] - n) <= 3 * se * n + 2, (page, value, n)
            inexact += value["visitors"] != n
        # An inexact small count needs such a collision; C(n, 2) / 2**p of them are expected.
        expected_collisions = sum(math.comb(len(by_page[key]), 2) / m for key in keys)
        assert inexact <= 3 * expected_collisions + 3, (inexact, expected_collisions)

        hours = output_rows(job, "hourly-visitors", partition)
        assert [hour for hour, _ in hours] == sorted(h for h in by_hour if h != open_hour)
        assert len(hours) >= 2
        for hour, value in hours:
            n = len(by_hour[hour])
            assert value["hour"] == hour
            assert value["pages"] == sum(1 for _, h in keys if h == hour)
            # The union of the page sketches is the sketch of the hour's users.
            assert value["visitors"] == reference_estimate(by_hour[hour], precision)
            assert abs(value["visitors"] - n) <= 3 * se * n + 0.5, (hour, value, n)  # + rounding
            assert n >= 1000, "hourly counts should be large enough for the relative bound to matter"
        hourly_emitted += [value for _, value in hours]

        # Closed hours are forgotten: the compacted changelog holds registers of open-hour sketches only.
        reader = changelogs.reader(job.stores["visitors"].changelog, partition)
        live = {r.key: r.value for r in reader.read(0)}
        reader.close()
        names = {split_key(key)[0].decode() for key, value in live.items() if value is not None and split_key(key)}
        assert names and all(name.startswith(f"{open_hour:012d}|") for name in names), sorted(names)[:3]
    changelogs.close()

    # Users are partitioned, so the partitions' counts add up to the global distinct count.
    merged = module["merge_partitions"](hourly_emitted)
    assert merged and set(merged) < set(global_users)
    for hour, visitors in merged.items():
        assert abs(visitors - len(global_users[hour])) <= 3 * se * len(global_users[hour]) + 1

    # A second run finds its input consumed and changes nothing.
    before = [output_rows(job, stream, p) for stream in sorted(job.outputs) for p in range(job.partitions)]
    assert SparkJobRunner(job, context=spark_context, progress=None).run().records_in == 0
    assert [output_rows(job, stream, p) for stream in sorted(job.outputs) for p in range(job.partitions)] == before


def words(title: str) -> set[str]:
    """The default tokenizer's terms for ASCII text: lower-cased runs of letters and digits."""
    return set(re.findall(r"[a-z0-9]+", title.lower()))


def expected_alerts(job: JobConfig, partition: int,
                    window_len: int) -> tuple[dict[tuple[str, int], dict[str, tuple[str, int]]], int]:
    """Independent: replay the partition's input files window by window in plain Python; a saved
    search matches a listing whose last change (not a sale) is in the window when every term is a
    word of its title and the category and price limits hold. Returns the alerts (listing id ->
    (title, price) per search and window) and how many matches a sale in the same window removed."""
    events = []
    for index, stream in enumerate(sorted(job.inputs)):  # ties by input name, like the runtime
        rows = read_jsonl(resolve_path(job, job.inputs[stream].options["path"]), partition)
        events += [(row["ts"], index, offset, stream, row) for offset, row in enumerate(rows)]
    events.sort(key=lambda e: e[:3])
    by_window: dict[int, list[tuple[str, dict[str, Any]]]] = {}
    for ts, _, _, stream, row in events:
        by_window.setdefault(int(ts // window_len) * window_len, []).append((stream, row))
    open_window = max(by_window)

    def matches(search: dict[str, Any], listing: dict[str, Any]) -> bool:
        return (all(term in words(listing["title"]) for term in search["terms"])
                and search["category"] in (None, listing["category"])
                and (search["max_price"] is None or listing["price"] <= search["max_price"]))

    listings: dict[str, tuple[int, dict[str, Any]]] = {}   # id -> (window of last change, listing)
    searches: dict[str, dict[str, Any]] = {}
    alerts: dict[tuple[str, int], dict[str, tuple[str, int]]] = {}
    removed_by_sale = 0
    for window in sorted(by_window):
        changed: dict[str, dict[str, Any]] = {}  # every version listed in this window
        for stream, row in by_window[window]:
            value = row["value"]
            if stream == "saved_searches":
                searches[row["key"]] = value
            elif value.get("sold"):
                listings.pop(row["key"], None)
            else:
                listings[row["key"]] = (window, value)
                changed[row["key"]] = value
        if window == open_window:
            break
        for search_id, search in searches.items():
            hits = {lid: (listing["title"], listing["price"]) for lid, (w, listing) in listings.items()
                    if w == window and matches(search, listing)}
            if hits:
                alerts[(search_id, window)] = hits
            removed_by_sale += sum(1 for lid, listing in changed.items()
                                   if lid not in listings and matches(search, listing))
    return alerts, removed_by_sale


def test_search_index_example_with_worker_kill(tmp_path: Path, spark_context: Any) -> None:
    job, module = prepare(tmp_path, "search_index")
    window_len = module["WINDOW"]
    marker = tmp_path / "killed-once"
    # Partition 0 dies 300 records into batch 1, after several windows closed in that batch, so the
    # index had already been flushed (changelog and local commit) past the last checkpoint.
    fault = {"partition": 0, "batch": 1, "after": 300, "marker": str(marker)}
    summary = SparkJobRunner(job, context=spark_context, batch_size=500, fault=fault, progress=None).run()
    assert marker.exists(), "the worker of partition 0 should have been SIGKILLed in batch 1"
    assert summary.lag == 0 and len(summary.batches) >= 4
    retried = summary.batches[1]
    assert retried.failed_attempts >= 1
    assert retried.trimmed > 0, "the retry should have neutralised the index flushed after the checkpoint"

    all_rows = []
    everything: dict[tuple[str, int], set[str]] = {}
    prices: dict[tuple[str, str], list[int]] = {}  # (search, listing) -> alerted prices, in window order
    removed = 0
    for partition in range(job.partitions):
        expected, removed_here = expected_alerts(job, partition, window_len)
        removed += removed_here
        rows = output_rows(job, "alerts", partition)
        keys = [(search_id, alert["window"]) for search_id, alert in rows]
        assert len(keys) == len(set(keys)), f"partition {partition}: an alert was emitted twice"
        assert [w for _, w in keys] == sorted(w for _, w in keys), "alerts leave in window order"
        actual = {}
        for search_id, alert in rows:
            hits = {lid: (title, price) for lid, title, price in alert["listings"]}
            assert len(hits) == len(alert["listings"]), f"a listing twice in {alert}"
            actual[(search_id, alert["window"])] = hits
        assert actual == expected, f"partition {partition}"
        all_rows += rows
        for (search_id, window), hits in sorted(expected.items(), key=lambda item: item[0][1]):
            everything.setdefault((search_id, window), set()).update(hits)
            for lid, (_, price) in hits.items():
                prices.setdefault((search_id, lid), []).append(price)

    # The shards' alerts together are the full answer.
    assert module["merge_partitions"](all_rows) == {key: sorted(ids) for key, ids in sorted(everything.items())}
    # The input exercises what it should: multi-listing alerts, a listing alerting again after a
    # price drop, and matches withdrawn by a sale in the same window.
    assert len(everything) > 100 and any(len(ids) > 3 for ids in everything.values())
    assert any(len(p) > 1 and p == sorted(p, reverse=True) and p[-1] < p[0] for p in prices.values())
    assert removed > 0


def test_windowed_distinct_counts_example(tmp_path: Path, spark_context: Any) -> None:
    """The windows library's distinct count (an HLL per page and hour, closed by event-time timers):
    every closed (page, hour) emitted once, with exactly the estimate datasketch makes of exactly
    that hour's users of that page."""
    job, module = prepare(tmp_path, "windowed_distinct_counts")
    hour_len = module["HOUR"]
    precision = job.stores["visitors"].options["precision"]
    summary = SparkJobRunner(job, context=spark_context, batch_size=9000, progress=None).run()
    assert summary.lag == 0 and len(summary.batches) >= 3
    merged_rows = []
    for partition in range(job.partitions):
        by_page: dict[tuple[str, int], set[str]] = {}
        rows = generated(job, "page_views", partition)
        for _, user, value in rows:
            by_page.setdefault((value["page"], int(value["ts"] // hour_len)), set()).add(user)
        last_ts = rows[-1][2]["ts"]  # the final watermark: hours ending at or before it are closed
        closed = {key for key in by_page if (key[1] + 1) * hour_len <= last_ts}
        pages = output_rows(job, "page-visitors", partition)
        keys = [(page, value["hour"]) for page, value in pages]
        assert len(keys) == len(set(keys)), f"partition {partition}: a (page, hour) was emitted twice"
        assert set(keys) == closed and closed
        for page, value in pages:
            assert value["visitors"] == reference_estimate(by_page[(page, value["hour"])], precision), (page, value)
        merged_rows += pages
    # Partitions hold disjoint users: a page's hour over the job is the sum of the partitions'.
    merged = module["merge_partitions"](merged_rows)
    assert sum(merged.values()) == sum(value["visitors"] for _, value in merged_rows)
