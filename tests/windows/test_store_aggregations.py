"""The aggregations kept in sketch and heap stores (distinct count in an HLL, quantiles in a KLL,
top-N in a heap) through TaskTestDriver, against the reference model; their state is deleted when a
window is emitted; a store of the wrong kind is a ConfigError naming the store."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from localstate.core.config import parse_job_config
from localstate.core.task import StreamTask
from localstate.errors import ConfigError
from localstate.testing.driver import TaskTestDriver
from localstate.windows import (Aggregation, Session, Tumbling, WindowedAggregation, count, distinct_count, quantiles,
                                 top_n)
from localstate.windows.reference import reference_windows, watermarks

BASE = 1_700_000_000.0

STORES = {
    "hll": {"engine": "sketch", "kind": "hll", "precision": 12, "key_serde": "string"},
    "kll": {"engine": "sketch", "kind": "quantiles", "key_serde": "string"},
    "heap": {"engine": "heap", "kind": "topn", "key_serde": "string"},
    "index": {"engine": "kv", "key_serde": "string", "value_serde": "json"},
}


def task_for(window: Any, aggregate: Aggregation, store: str) -> type[StreamTask]:
    class Windowed(StreamTask):
        def init(self, context: Any) -> None:
            self.windows = WindowedAggregation(context, window, aggregate, store=store, output="out",
                                               index_store="index")

        def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
            self.windows.add(envelope.key, envelope.value, envelope.timestamp, collector)

    return Windowed


def run(tmp_path: Path, window: Any, aggregate: Aggregation, store: str,
        stream: list[tuple[str, Any, float]]) -> tuple[dict, dict, TaskTestDriver]:
    job = parse_job_config({"job": {"name": "w", "partitions": 1, "task": "unused:Unused",
                                    "state_dir": str(tmp_path), "commit_interval": 10 ** 9},
                            "time": {"timers": True}, "stores": STORES, "changelogs": {"file": {}}},
                           base_dir=tmp_path)
    driver = TaskTestDriver(task_for(window, aggregate, store), job=job)
    for key, value, ts in stream:
        driver.send("events", key, value, timestamp=ts)
    driver.commit()
    sent = {(k, v["start"], v["end"]): v["value"] for k, v in driver.outputs("out")}
    marks = watermarks([ts for *_, ts in stream])
    expected = reference_windows([(k, v, ts, w) for (k, v, ts), w in zip(stream, marks)], window, aggregate)
    return sent, {(k, w.start, w.end): value for k, w, value in expected.outputs}, driver


def views(n: int, users: int, seed: int) -> list[tuple[str, Any, float]]:
    rng = random.Random(seed)
    # out of order by up to 20 s; pages are the keys
    return [(f"/p{rng.randrange(3)}", {"user": f"u{rng.randrange(users)}", "ms": rng.randrange(1000)},
             BASE + i * 0.5 + rng.uniform(-20, 0)) for i in range(n)]


def test_distinct_count_per_window_is_the_hll_estimate_of_the_exact_count(tmp_path: Path) -> None:
    sent, expected, driver = run(tmp_path, Tumbling(60), distinct_count(lambda v: v["user"]), "hll",
                                 views(3000, 400, 1))
    with driver:
        assert sent.keys() == expected.keys() and len(sent) >= 3 * 20
        for window, exact in expected.items():
            assert abs(sent[window] - exact) <= max(2, 0.05 * exact), (window, sent[window], exact)
        # emitted windows are gone from the store: only the open ones remain
        assert all(name.split("|", 1)[1] in {"/p0", "/p1", "/p2"} for name in driver.store("hll").names())
        assert len(driver.store("hll").names()) <= 3 * 2


def test_quantiles_per_window_from_kll(tmp_path: Path) -> None:
    sent, expected, driver = run(tmp_path, Tumbling(60), quantiles([0.0, 0.5, 1.0], lambda v: v["ms"]), "kll",
                                 views(2000, 50, 2))
    with driver:
        assert sent.keys() == expected.keys() and sent
        # Fewer values per window than the sketch's k (200): KLL holds them all and is exact.
        assert sent == expected


def test_top_n_per_window_from_the_heap_is_exact(tmp_path: Path) -> None:
    stream = [(f"u{i % 4}", {"page": f"/p{(i * 7) % 5 if i % 3 else 1}"}, BASE + i) for i in range(400)]
    sent, expected, driver = run(tmp_path, Tumbling(50), top_n(2, lambda v: v["page"]), "heap", stream)
    with driver:
        assert sent == expected and len(sent) == 4 * 7
        assert len(driver.store("heap")) <= 4 * 5  # only the open window's items are left


def test_session_distinct_counts_merge_their_sketches(tmp_path: Path) -> None:
    stream = [("k", {"user": f"u{i % 30}"}, BASE + t) for i, t in enumerate([0, 3, 20, 9, 6, 14, 40, 17, 60, 61])]
    sent, expected, driver = run(tmp_path, Session(5), distinct_count(lambda v: v["user"]), "hll", stream)
    with driver:
        assert sent == expected and len(sent) >= 2


def test_an_aggregation_on_a_store_of_another_kind_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        run(tmp_path, Tumbling(60), count(), "hll", views(5, 5, 3))
    assert caught.value.problems[0].path == "stores.hll.engine"
    assert "must be a kv store" in str(caught.value)


@pytest.mark.parametrize(("options", "where"), [
    ({"emit": "sometimes"}, "window.emit"),
    ({"lateness": "-5s"}, "window.lateness"),
    ({"lateness": "soon"}, "window.lateness"),
])
def test_bad_operator_options_are_config_errors(tmp_path: Path, options: dict, where: str) -> None:
    class Bad(StreamTask):
        def init(self, context: Any) -> None:
            WindowedAggregation(context, Tumbling(60), count(), store="index", output="out", **options)

        def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
            raise AssertionError("not reached")

    job = parse_job_config({"job": {"name": "w", "partitions": 1, "task": "unused:Unused", "state_dir": str(tmp_path)},
                            "time": {"timers": True}, "stores": STORES, "changelogs": {"file": {}}}, base_dir=tmp_path)
    with pytest.raises(ConfigError) as caught:
        TaskTestDriver(Bad, job=job)
    assert caught.value.problems[0].path == where
