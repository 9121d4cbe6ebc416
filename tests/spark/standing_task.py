"""The counting task of the standing-run tests (imported by the Python workers): ``CountByKey``, and a
record whose value names a ``marker`` file is slow, once: the first attempt to process it writes its
Python worker's pid to the marker and sleeps ``sleep`` seconds (a batch to signal or kill in the
middle of); an attempt that finds the marker already written goes straight on, and of records that
name the same marker and are processed at once (other partitions) only one is slow."""

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
            if not marker.exists() and _claim(marker):
                time.sleep(float(value.get("sleep", 3.0)))
        super().process(envelope, collector, coordinator)


def _claim(marker: Path) -> bool:
    """Write this worker's pid to ``marker`` unless another worker did first: records of several
    partitions may name the same marker and be processed at once, and only one of them is slow. The
    pid goes to a file of this worker's own, linked to ``marker`` (a link fails if ``marker`` exists),
    so that a reader never sees the marker empty."""
    partial = marker.with_suffix(f".partial-{os.getpid()}")
    partial.write_text(str(os.getpid()))
    try:
        os.link(partial, marker)
    except FileExistsError:
        return False
    finally:
        partial.unlink()
    return True
