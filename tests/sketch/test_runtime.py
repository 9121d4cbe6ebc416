"""The sketch engine under the runtime (TaskTestDriver): config, commit, crash, replay."""

from __future__ import annotations

import numpy as np
import pytest

from localstate.core.task import StreamTask
from localstate.testing.driver import TaskTestDriver


class DistinctVisitors(StreamTask):
    def init(self, context):  # noqa: ANN001, ANN201 - StreamTask signature
        self.visitors = context.store("visitors")

    def process(self, envelope, collector, coordinator):  # noqa: ANN001, ANN201
        self.visitors.add(envelope.value["page"], envelope.key)


STORES = {"visitors": {"engine": "sketch", "key_serde": "string", "kind": "hll", "precision": 10}}


def test_uncommitted_adds_are_rolled_back_and_replayed_exactly_once() -> None:
    pytest.importorskip("localstate.changelog.file")
    with TaskTestDriver(DistinctVisitors, stores=STORES) as driver:
        for i in range(3000):
            driver.send("views", f"user-{i}", {"page": "/home"})
        driver.commit()
        committed = driver.store("visitors").registers("/home").copy()
        for i in range(3000, 6000):
            driver.send("views", f"user-{i}", {"page": "/home"})
        driver.crash()
        driver.restart()  # store rolls back to the checkpoint, then the inputs after it are replayed
        driver.commit()
        store = driver.store("visitors")
        with TaskTestDriver(DistinctVisitors, stores=STORES) as clean:
            for i in range(6000):
                clean.send("views", f"user-{i}", {"page": "/home"})
            clean.commit()
            assert np.array_equal(store.registers("/home"), clean.store("visitors").registers("/home"))
        assert not np.array_equal(committed, store.registers("/home"))
        assert store.count("/home") == pytest.approx(6000, rel=3 * store.standard_error)
