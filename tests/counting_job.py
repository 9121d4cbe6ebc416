"""The counting jobs of the Spark tests (``tests/spark/count_task.py``'s ``CountByKey``): one builder
for their ``job.toml`` and one reader of their final counts.

Every counting job reads JSON-lines input ``events`` from ``data`` (see :mod:`keyed_events`),
counts records per key in kv store ``counts`` and emits the running count to the file output
``counts-out`` (``out``), with ``state_dir = "state"``, all relative to the job file. The variants
the tests need (partition count, store engine or backend, bad-input policy, more outputs,
changelog systems and their options) are keyword arguments; each section's extra options are
merged over (and may replace) the defaults."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from localstate.core.config import JobConfig
from localstate.core.stream import open_output
from toml_tables import toml_text  # tests/ is on sys.path (tests/conftest.py)

__all__ = ["SPARK_TESTS", "counting_job_text", "write_counting_job", "final_counts"]

SPARK_TESTS = Path(__file__).resolve().parent / "spark"  # where count_task.py is (the job's pythonpath)
TASK = "count_task:CountByKey"
OUTPUT = "counts-out"


def counting_job_text(name: str, *, partitions: int = 2, job: Mapping[str, Any] | None = None,
                      events: Mapping[str, Any] | None = None, outputs: Mapping[str, Mapping[str, Any]] | None = None,
                      changelogs: Mapping[str, Mapping[str, Any]] | None = None,
                      store: Mapping[str, Any] | None = None, kafka: Mapping[str, str] | None = None,
                      time: Mapping[str, Any] | None = None) -> str:
    """The TOML text of counting job ``name`` with ``partitions`` partitions.

    ``job``, ``events`` and ``store``: more (or other) options of ``[job]``, ``[inputs.events]`` and
    ``[stores.counts]`` (e.g. ``job={"changelog": "objectstore"}``, ``events={"on_error": "skip"}``,
    ``store={"backend": "memory"}``); ``outputs``: outputs besides ``counts-out`` (e.g. a dead-letter
    stream); ``changelogs``: ``[changelogs.<system>]`` tables; ``kafka``: read ``events`` from a Kafka
    topic instead of ``data`` (``{"bootstrap_servers": ..., "topic": ...}``); ``time``: a ``[time]`` table
    (the watermark and timers)."""
    tables = {
        "job": {"name": name, "partitions": partitions, "task": TASK, "state_dir": "state", "pythonpath": [SPARK_TESTS],
                **(job or {})},
        "inputs.events": {**({"system": "kafka", **kafka} if kafka else {"system": "jsonl", "path": "data"}),
                          **(events or {})},
        f"outputs.{OUTPUT}": {"system": "file", "path": "out"},
        **{f"outputs.{output}": options for output, options in (outputs or {}).items()},
        **{f"changelogs.{system}": options for system, options in (changelogs or {}).items()},
        "stores.counts": {"engine": "kv", "key_serde": "string", "value_serde": "int", **(store or {})},
        **({"time": dict(time)} if time else {}),
    }
    return toml_text(tables)


def write_counting_job(directory: Path, name: str, **variant: Any) -> Path:
    """Write :func:`counting_job_text` (``name``, ``variant``) to ``directory/job.toml``; return its path."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "job.toml"
    path.write_text(counting_job_text(name, **variant))
    return path


def final_counts(job: JobConfig) -> dict[str, int]:
    """Each key's last emitted count, over every partition of ``counts-out``."""
    output = open_output(job, OUTPUT)
    try:
        return {key: count for partition in range(job.partitions) for key, count in output.read(partition)}
    finally:
        output.close()
