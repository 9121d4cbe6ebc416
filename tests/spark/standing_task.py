"""The counting task of the standing-run tests (imported by the Python workers): ``CountByKey``, and a
record whose value names a ``marker`` file is slow, once: the first attempt to process it writes its
Python worker's pid to the marker and sleeps ``sleep`` seconds (a batch to signal or kill in the
middle of); an attempt that finds the marker already written goes straight on."""

from __future__ import annotations

import os
import time
from pathlib import Path

from count_task import CountByKey

from localstate.core.task import Collector, Coordinator, Envelope


class SlowOnce(CountByKey):
    def process(self, envelope: Envelope, collector: Collector, coordinator: Coordinator) -> None:
        value = envelope.value
        if isinstance(value, dict) and "marker" in value:
            marker = Path(value["marker"])
            if not marker.exists():
                partial = marker.with_suffix(".partial")
                partial.write_text(str(os.getpid()))
                partial.replace(marker)
                time.sleep(float(value.get("sleep", 3.0)))
        super().process(envelope, collector, coordinator)

