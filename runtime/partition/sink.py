"""Where a task partition's committed outputs go: the :class:`OutputSink` contract,
:class:`MemorySink` (lists per stream partition: tests and the TaskTestDriver) and
:class:`StreamSink`, the sink over a job's configured outputs.

``write`` appends each stream's messages to the producing task partition's own output partition,
durably, and returns the end position of *every* configured output (so a checkpoint always names
them all); ``rollback`` truncates each to its checkpointed position. Together with the runtime's
commit order this gives exactly-once outputs for file and JSON-lines streams.

Transactional outputs (Kafka, two-phase commit) leave each commit's transaction open: ``pending``
is what the checkpoint records of them, ``commit`` commits them once that checkpoint is saved (the
Spark driver, which saves it in another process, uses :func:`commit_recorded`). At open,
``resume`` first commits what the loaded checkpoint recorded, and ``fence``, after the open's own
checkpoint is saved, aborts whatever a crashed attempt left open after it.

An output never destroys data the job did not write: an output that also is an input (or another
output) is refused when the sink is built, and ``rollback`` refuses (OutputError) to truncate an
output partition that holds data no checkpoint of this job covers, unless ``overwrite = true``.
"""

from __future__ import annotations

from typing import Any, Mapping, Protocol

from localstate.core.config import JobConfig
from localstate.runtime.layout import state_places
from localstate.core.stream import OutputStream, open_input, open_output, overlap_problems
from localstate.core.task import OutgoingMessage
from localstate.errors import ConfigError, OutputError, TaskError
from localstate.runtime.partition.faults import crash_point

__all__ = ["OutputSink", "MemorySink", "StreamSink", "NoTransactions", "commit_recorded"]


class OutputSink(Protocol):
    """Where committed outputs go. ``write`` is durable and returns the end position of each
    stream written; ``rollback`` discards anything after the given positions (exactly-once outputs
    for sinks that can do it) and may return the position of every output for the next checkpoint."""

    def write(self, partition: int, messages: list[OutgoingMessage]) -> Mapping[str, int]: ...

    def rollback(self, partition: int, positions: Mapping[str, int]) -> Mapping[str, int] | None: ...

    transactional: bool
    """whether some output keeps transactions open between a commit's write and its checkpoint"""

    def pending(self, partition: int) -> dict[str, dict[str, Any]]:
        """output -> the transaction the last ``write`` left open (for the checkpoint)."""
        ...

    def commit(self, partition: int) -> None:
        """The checkpoint naming ``pending`` is saved: commit those transactions."""
        ...

    def resume(self, partition: int, transactions: Mapping[str, Mapping[str, Any]]) -> None:
        """At open, before ``rollback``: commit the transactions the loaded checkpoint recorded."""
        ...

    def fence(self, partition: int) -> None:
        """At open, once the open's checkpoint is saved: abort what older attempts left open."""
        ...


class NoTransactions:
    """The transaction steps of a sink whose outputs have none."""

    transactional = False

    def pending(self, partition: int) -> dict[str, dict[str, Any]]:
        return {}

    def commit(self, partition: int) -> None:
        pass

    def resume(self, partition: int, transactions: Mapping[str, Mapping[str, Any]]) -> None:
        pass

    def fence(self, partition: int) -> None:
        pass


class MemorySink(NoTransactions):
    """Outputs kept in lists per (stream, partition): for tests and the TaskTestDriver."""

    def __init__(self) -> None:
        self.streams: dict[tuple[str, int], list[OutgoingMessage]] = {}

    def write(self, partition: int, messages: list[OutgoingMessage]) -> dict[str, int]:
        for message in messages:
            self.streams.setdefault((message.stream, partition), []).append(message)
        return {stream: len(items) for (stream, p), items in self.streams.items() if p == partition}

    def rollback(self, partition: int, positions: Mapping[str, int]) -> None:
        for (stream, p), items in self.streams.items():
            if p == partition:
                del items[positions.get(stream, 0):]

    def messages(self, stream: str) -> list[OutgoingMessage]:
        return [m for (s, _), items in sorted(self.streams.items()) if s == stream for m in items]


class StreamSink:
    """Writes task outputs to the job's ``[outputs.*]`` streams."""

    def __init__(self, job: JobConfig) -> None:
        self.job = job
        self.outputs: dict[str, OutputStream] = {name: open_output(job, name) for name in sorted(job.outputs)}
        problems = overlap_problems({name: open_input(job, name) for name in job.inputs}, self.outputs,
                                    state_places(job))
        if problems:
            self.close()
            raise ConfigError(problems, source=job.source,
                              hint="give every output its own path or topic, apart from the inputs")
        self.written = 0
        self._transactional = {name: output for name, output in self.outputs.items()
                               if getattr(output, "transactional", False)}
        self.transactional = bool(self._transactional)

    def write(self, partition: int, messages: list[OutgoingMessage]) -> dict[str, int]:
        grouped: dict[str, list[tuple[Any, Any]]] = {}
        for message in messages:
            if message.stream not in self.outputs:
                raise TaskError(f"the task sent a message to undeclared output stream {message.stream!r}",
                                stream=message.stream, partition=partition,
                                hint=f"declare [outputs.{message.stream}] in the job config "
                                     f"(declared: {', '.join(self.outputs) or 'none'})")
            grouped.setdefault(message.stream, []).append((message.key, message.value))
        self.written += len(messages)
        positions = {name: output.append(partition, grouped.get(name, [])) for name, output in self.outputs.items()}
        crash_point("after_outputs")  # delivered (transactions open), the checkpoint not written yet
        return positions

    def rollback(self, partition: int, positions: Mapping[str, int]) -> dict[str, int]:
        """Truncate every output to ``positions`` (the checkpoint's) and return the position of
        every output, so the next checkpoint covers them all. An output the checkpoint does not
        name is new to this job: it must be empty, unless the operator opted into ``overwrite``."""
        result = dict(positions)
        for name, output in self.outputs.items():
            if name in positions:
                output.truncate(partition, positions[name])
            else:
                self._check_unwritten(partition, name, output)
                result[name] = output.truncate(partition, 0)
        return result

    def pending(self, partition: int) -> dict[str, dict[str, Any]]:
        found = {name: output.pending(partition) for name, output in self._transactional.items()}
        return {name: pending for name, pending in found.items() if pending is not None}

    def commit(self, partition: int) -> None:
        for output in self._transactional.values():
            output.commit(partition)

    def resume(self, partition: int, transactions: Mapping[str, Mapping[str, Any]]) -> None:
        for name, pending in sorted(transactions.items()):
            _commit_recorded(self.job, partition, name, self._transactional.get(name), pending)

    def fence(self, partition: int) -> None:
        for output in self._transactional.values():
            output.fence(partition)

    def _check_unwritten(self, partition: int, name: str, output: OutputStream) -> None:
        if not output.exactly_once or output.overwrite:
            return  # at-least-once outputs (Kafka) never truncate; overwrite is the operator's opt-in
        existing = output.end_offset(partition)
        if existing > 0:
            place = output.location()
            raise OutputError(
                f"output {name!r} partition {partition} already holds {existing} record(s) that no checkpoint "
                f"of job {self.job.name!r} covers: starting would truncate them",
                stream=name, partition=partition, path=place[1] if place else None,
                hint=f"move the existing data away or point outputs.{name} elsewhere; to replace it on "
                     f"purpose, set overwrite = true in [outputs.{name}]")

    def close(self) -> None:
        for output in self.outputs.values():
            output.close()


def commit_recorded(job: JobConfig, partition: int, transactions: Mapping[str, Mapping[str, Any]]) -> None:
    """Commit the output transactions a saved checkpoint of ``partition`` recorded, from a process
    that holds no producer of them (the Spark driver, right after saving the checkpoint)."""
    for name, pending in sorted(transactions.items()):
        output = open_output(job, name) if name in job.outputs else None
        try:
            _commit_recorded(job, partition, name, output if getattr(output, "transactional", False) else None,
                             pending)
        finally:
            if output is not None:
                output.close()


def _commit_recorded(job: JobConfig, partition: int, name: str, output: Any,
                     pending: Mapping[str, Any]) -> None:
    if output is None:
        raise OutputError(f"the checkpoint of task partition {partition} names an open transaction of output "
                          f"{name!r}, which is not a transactional output of job {job.name!r} any more: its "
                          f"records would never be committed", stream=name, partition=partition,
                          transactional_id=pending.get("id"),
                          hint=f"run the job once more with [outputs.{name}] as it was (transactions = true) to "
                               f"commit them, then change the output")
    output.commit_recorded(partition, pending)
