"""bench standing's Kafka part: the pure helpers (who saw what, which ratios) and the topic configs
``ensure_topic`` sets on a created topic (what Quix Streams reads back). No timing is asserted."""

from __future__ import annotations

import numpy as np
from kafka.admin import ConfigResource, ConfigResourceType

from bench.standing import Events, Watcher, _ratios
from bench.report import Report
from localstate.changelog.kafka.client import CONNECTION_OPTIONS, client_settings
from localstate.changelog.kafka.io import ensure_topic
from localstate.changelog.kafka.system import KafkaChangelogSystem, _config_map
from localstate.core.options import validate_options


def test_a_count_makes_every_event_of_its_user_up_to_it_visible() -> None:
    events = Events(None, users=3, capacity=9, ss=False, tick=0.1)
    watcher = Watcher([], events)
    watcher.saw(1, 2, now=5.0)  # user 1's events are 1, 4, 7
    watcher.saw(1, 1, now=6.0)  # a lower count (a replay) changes nothing
    assert np.isnan(watcher.visible[[0, 2, 3, 5, 6, 7, 8]]).all()
    assert watcher.visible[1] == watcher.visible[4] == 5.0


def _run(p99: float, throughput: float) -> tuple[dict, dict[int, dict], float]:
    return {"warm": True, "throughput": throughput}, {10_000: {"p50_ms": p99 / 2, "p99_ms": p99, "p99_9_ms": p99}}, 1.0


def test_the_ratios_the_issue_targets() -> None:
    report = Report("standing", {})
    _ratios(report, {"localstate micro-batch, Kafka": _run(1000.0, 10.0),
                     "localstate continuous, Kafka": _run(50.0, 9.0),
                     "Quix Streams exactly-once, Kafka": _run(200.0, 5.0)}, [10_000], burst=1)
    assert report.ratios["p99 latency: micro-batch / continuous, Kafka at 10,000/s"] == 20.0
    assert report.targets["p99 latency: micro-batch / continuous, Kafka at 10,000/s"] == ">= 10"
    assert report.ratios["p99 latency: Quix Streams exactly-once / localstate continuous, Kafka at 10,000/s"] == 4.0
    assert report.targets["p99 latency: Quix Streams exactly-once / localstate continuous, Kafka at 10,000/s"] == ">= 1"
    assert report.ratios["sustained throughput: continuous / micro-batch, Kafka"] == 0.9


def test_ensure_topic_sets_the_configs_of_a_created_topic(kafka_broker, topic_prefix) -> None:
    settings = client_settings(validate_options(CONNECTION_OPTIONS,
                                                {"bootstrap_servers": kafka_broker.bootstrap_servers}, "test"))
    topic = f"{topic_prefix}retained"
    assert ensure_topic(settings, topic, 2, -1, create=True, configs={"retention.ms": "-1"}) == 2
    admin = KafkaChangelogSystem({"bootstrap_servers": kafka_broker.bootstrap_servers}).admin()
    described = admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, topic)], config_filter="all")
    assert _config_map(described, topic).get("retention.ms") == "-1"


def test_the_floor_rows_give_how_far_each_mode_is_above_the_floor() -> None:
    report = Report("standing", {})
    _ratios(report, {"localstate micro-batch": _run(300.0, 10.0), "localstate continuous": _run(30.0, 9.0),
                     "floor": _run(10.0, 1.0)}, [10_000], burst=1)
    assert report.ratios["p99 latency: continuous / floor at 10,000/s"] == 3.0
    assert report.ratios["p99 latency: micro-batch / floor at 10,000/s"] == 30.0
    assert not any(label.startswith("p99 latency: floor") for label in report.ratios)  # not a peer


def test_the_floor_counts_every_event_once_and_stops_on_sigterm(tmp_path) -> None:
    """bench/standing_floor.py on JSON lines: each key's last output is its count, then SIGTERM ends it."""
    import json
    import signal
    import subprocess
    import sys
    import time

    from bench.standing import FLOOR, _setup

    _setup(tmp_path)
    job = tmp_path / "job"
    for p in (0, 1):
        (job / "data" / f"{p}.jsonl").write_text("".join(f'{{"key":"user-{i % 3}","value":1,"ts":{i}}}\n'
                                                         for i in range(p * 100, p * 100 + 10)))
    proc = subprocess.Popen([sys.executable, str(FLOOR), "--input", "jsonl", "--root", str(job)])
    try:
        def last() -> dict[str, int]:
            seen: dict[str, int] = {}
            for p in (0, 1):
                out = job / "out" / f"{p}.jsonl"
                for line in out.read_text().splitlines() if out.exists() else []:
                    record = json.loads(line)
                    seen[f"{p}/{record['key']}"] = record["value"]
            return seen

        deadline = time.monotonic() + 120
        while len(last()) < 6 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert last() == {"0/user-0": 4, "0/user-1": 3, "0/user-2": 3, "1/user-0": 3, "1/user-1": 4, "1/user-2": 3}
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0


def test_the_kafka_watcher_sees_counts_once_their_transaction_commits(kafka_broker, topic_prefix) -> None:
    """The watcher's reader runs in a process of its own and reads read_committed: the reader-floor
    events (each tick's counts in one transaction) become visible, every one of them."""
    from bench.standing import KafkaOutputEvents, KafkaWatcher, _kafka_topics

    settings = client_settings(validate_options(CONNECTION_OPTIONS,
                                                {"bootstrap_servers": kafka_broker.bootstrap_servers}, "test"))
    _, topic = _kafka_topics(settings, f"{topic_prefix}reader")
    events = KafkaOutputEvents(settings, topic, users=10, capacity=100, tick=0.1)
    watcher = KafkaWatcher(settings, topic, events)
    watcher.start()
    try:
        events.write(25)
        assert watcher.caught_up(25, 120.0)
        assert not np.isnan(watcher.visible[:25]).any() and np.isnan(watcher.visible[25:]).all()
        assert (watcher.visible[:25] >= events.appended[:25] - 1.0).all()  # seen after (or as) it was written
    finally:
        watcher.stop.set()
        watcher.join()
        events.producer.close(timeout=1)
