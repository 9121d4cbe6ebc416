"""``StreamSink``: the :class:`~localstate.runtime.partition.instance.OutputSink` over a job's configured outputs.

``write`` appends each stream's messages to the producing task partition's own output partition,
durably, and returns the end position of *every* configured output (so a checkpoint always names
them all); ``rollback`` truncates each to its checkpointed position. Together with the runtime's
commit order this gives exactly-once outputs for file and JSON-lines streams.

An output never destroys data the job did not write: an output that also is an input (or another
output) is refused when the sink is built, and ``rollback`` refuses (OutputError) to truncate an
output partition that holds data no checkpoint of this job covers, unless ``overwrite = true``.
"""

from __future__ import annotations

from typing import Any, Mapping

from localstate.core.config import JobConfig
from localstate.runtime.layout import state_places
from localstate.core.stream import OutputStream, open_input, open_output, overlap_problems
from localstate.core.task import OutgoingMessage
from localstate.errors import ConfigError, OutputError, TaskError

__all__ = ["StreamSink"]


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
        return {name: output.append(partition, grouped.get(name, [])) for name, output in self.outputs.items()}

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
