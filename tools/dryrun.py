"""``localstate validate --dry-run N``: the job's task on the first records of its inputs, in this
process, through the lifecycle every runtime runs (:class:`~localstate.runtime.partition.lifecycle.InProcessPartition`),
on scratch state.

What a dry run catches that reading the config cannot: a task that fails on real records, values its
stores' serdes cannot encode, keys a window aggregation cannot take, outputs the task sends to an
undeclared stream, bad input records and what their ``on_error`` does with them. Nothing of the
job's state is read or written: the stores live in a temporary directory with in-memory changelogs,
and the outputs in memory. The inputs are only read (a Kafka input is read from its broker).
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field, replace
from itertools import islice
from pathlib import Path

from localstate.core.config import JobConfig
from localstate.core.stream import InputRecord, open_input
from localstate.runtime.layout import open_changelog_system
from localstate.runtime.partition.instance import TaskInstance
from localstate.runtime.partition.lifecycle import InProcessPartition
from localstate.runtime.partition.sink import MemorySink

__all__ = ["DryRunPartition", "dry_run"]


@dataclass
class DryRunPartition:
    """What the dry run of one partition did."""

    partition: int
    records: int = 0
    skipped: int = 0
    dead_lettered: int = 0
    timers_fired: int = 0
    outputs: dict[str, int] = field(default_factory=dict)
    """output stream -> messages the task sent to it"""

    def describe(self) -> str:
        bad = f" ({self.skipped} bad skipped, {self.dead_lettered} dead-lettered)" \
            if self.skipped or self.dead_lettered else ""
        sent = ", ".join(f"{stream}: {count}" for stream, count in sorted(self.outputs.items())) or "none"
        return (f"partition {self.partition}: {self.records} record(s) in{bad}, outputs {sent}, "
                f"{self.timers_fired} timer(s) fired")


def _scratch(job: JobConfig, directory: Path) -> JobConfig:
    """``job`` with its state in ``directory`` and in-memory changelogs: nothing of the job's own."""
    return replace(job, state_dir=directory, local_dir=None, changelog_system="memory",
                   changelog_options={"memory": {}}, metrics_port=None)


def dry_run(job: JobConfig, records: int) -> list[DryRunPartition]:
    """Run the task on up to ``records`` records of each input partition (every partition), commit,
    and report; raises what the task, the stores or an input policy raise (typed)."""
    done = []
    with tempfile.TemporaryDirectory(prefix="localstate-dry-run-") as scratch:
        scratch_job = _scratch(job, Path(scratch))
        inputs = {name: open_input(job, name) for name in sorted(job.inputs)}
        changelogs = open_changelog_system(scratch_job)
        try:
            for partition in range(job.partitions):
                pairs: list[tuple[str, InputRecord]] = []
                for name, source in inputs.items():
                    end = min(source.end_offset(partition), records)
                    pairs += [(name, record) for record in islice(source.read(partition, 0, end), records)]
                sink = MemorySink()
                instance = TaskInstance(scratch_job, partition, changelogs, sink)
                try:
                    instance.open()
                    batch = InProcessPartition(instance, pairs, inputs).run()
                    instance.commit()
                    report = DryRunPartition(partition, timers_fired=instance.timers_fired,
                                             outputs={stream: len(messages)
                                                      for (stream, _), messages in sink.streams.items()})
                    if batch is not None:
                        report.records, report.skipped = batch.records, batch.skipped
                        report.dead_lettered = batch.dead_lettered
                    done.append(report)
                finally:
                    instance.abandon()
        finally:
            changelogs.close()
            for source in inputs.values():
                close = getattr(source, "close", None)
                if callable(close):
                    close()
    return done
