"""The windowed tasks of the Spark window tests (imported by the Python workers from this folder):
a tumbling count and its job config."""

from __future__ import annotations

from pathlib import Path

from localstate.core.config import JobConfig, parse_job_config
from localstate.core.task import Collector, Coordinator, Envelope, StreamTask, TaskContext
from localstate.windows import Tumbling, WindowedAggregation, count

HERE = Path(__file__).resolve().parent
SIZE = 10.0


class TumblingCount(StreamTask):
    """Records per key per 10-second window, sent once when the window closes; late ones to ``late``."""

    def init(self, context: TaskContext) -> None:
        self.windows = WindowedAggregation(context, Tumbling(SIZE), count(), store="counts", output="windows",
                                           late_output="late")

    def process(self, envelope: Envelope, collector: Collector, coordinator: Coordinator) -> None:
        self.windows.add(envelope.key, envelope.value, envelope.timestamp, collector)


def job_config(state_dir: Path, partitions: int = 2) -> JobConfig:
    return parse_job_config({
        "job": {"name": "df-windows", "partitions": partitions, "task": "window_tasks:TumblingCount",
                "state_dir": str(state_dir), "pythonpath": [str(HERE)]},
        "time": {"timers": True},
        "stores": {"counts": {"engine": "kv", "backend": "rocksdb", "key_serde": "string", "value_serde": "int"}},
    }, base_dir=HERE)
