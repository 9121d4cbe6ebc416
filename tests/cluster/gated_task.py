"""The counting task of the cluster tests, with a test-only gate to stop a task mid-batch.

The gate is a directory next to the job file (``<job dir>/gate``), the test's control channel: while
``hold-<partition>`` exists, a task of that partition, at its first record, writes
``reached-<partition>-<pid>`` (holding its ``SPARK_LOCAL_DIRS``, which tells the test which worker
runs it) and waits; once the file is gone it writes ``passed-<partition>-<pid>`` and goes on.

``hold-close-<partition>`` does the same in the task's ``close()`` (files ``closing-*`` and
``closed-*``): the runtime closes the task after the batch's commit was prepared, so a task held
there has written its changelog records and its outputs but not yet returned its result."""

from __future__ import annotations

import os
import time
from pathlib import Path

from localstate.core.task import Collector, Coordinator, Envelope, StreamTask, TaskContext


class GatedCount(StreamTask):
    """Counts records per key in store ``counts`` and emits the running count to ``counts-out``."""

    def init(self, context: TaskContext) -> None:
        self.counts = context.store("counts")
        self.partition = context.partition
        self.gate = Path(context.config.source).parent / "gate"  # type: ignore[union-attr, arg-type]
        self.checked = False

    def _wait_at_gate(self, hold_name: str = "hold", reached: str = "reached", passed: str = "passed") -> None:
        hold = self.gate / f"{hold_name}-{self.partition}"
        if not hold.exists():
            return
        me = f"{self.partition}-{os.getpid()}"
        (self.gate / f"{reached}-{me}").write_text(os.environ.get("SPARK_LOCAL_DIRS", ""))
        while hold.exists():
            time.sleep(0.05)
        (self.gate / f"{passed}-{me}").write_text("")

    def process(self, envelope: Envelope, collector: Collector, coordinator: Coordinator) -> None:
        if not self.checked:
            self.checked = True
            self._wait_at_gate()
        count = (self.counts.get(envelope.key) or 0) + 1
        self.counts.put(envelope.key, count)
        collector.send("counts-out", envelope.key, count)

    def close(self) -> None:
        self._wait_at_gate("hold-close", "closing", "closed")
