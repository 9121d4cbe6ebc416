"""The process's pooled Kafka producers stay idle when idle, on a real broker (Tansu).

A kafka-python 3.0 producer that sends to a topic created after its last metadata fetch refreshes
that topic alone, forgets the leaders of the topics it sent to before, and its sender thread asks for
metadata in a loop from then on: a whole core, for as long as the process lives (a worker reused for
months). localstate pools one producer per topic (``changelog/kafka/io.py``: ``_producer``), which
never adds a topic."""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import pytest

from localstate.changelog.kafka.client import CONNECTION_OPTIONS, client_settings
from localstate.changelog.kafka.io import close_clients
from localstate.changelog.kafka.streams import ensure_topic, produce
from localstate.core.options import validate_options

pytestmark = pytest.mark.kafka


def _sender_cpu() -> float:
    """CPU seconds used so far by this process's producer sender threads (``*-network-thread``)."""
    total = 0.0
    for thread in threading.enumerate():
        if not thread.name.endswith("-network-thread") or thread.native_id is None:
            continue
        try:
            with open(f"/proc/self/task/{thread.native_id}/stat") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
        except OSError:
            continue  # the thread ended
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


@pytest.mark.skipif(not os.path.exists("/proc/self/task"), reason="reads thread CPU times from /proc")
def test_producers_stay_idle_after_sending_to_a_topic_created_later(kafka_broker, topic_prefix) -> None:  # noqa: ANN001
    settings: dict[str, Any] = client_settings(validate_options(
        CONNECTION_OPTIONS, {"bootstrap_servers": kafka_broker.bootstrap_servers}, "test"))
    first, later = topic_prefix + "first", topic_prefix + "later"
    close_clients()  # pooled producers of earlier tests are not this test's
    try:
        assert ensure_topic(settings, first, 1, -1, create=True) == 1
        produce(settings, first, [(b"k", b"v", 0)])
        assert ensure_topic(settings, later, 1, -1, create=True) == 1  # created after the first send
        produce(settings, later, [(b"k", b"v", 0)])
        before = _sender_cpu()
        time.sleep(2.0)
        # Idle senders wake for metadata refreshes only; a looping one uses the whole 2 s.
        assert _sender_cpu() - before < 0.5
    finally:
        close_clients()
