"""``StreamSink``: the :class:`~localstate.core.runtime.OutputSink` over a job's configured outputs.

``write`` appends each stream's messages to the producing task partition's own output partition,
durably, and returns the end position of *every* configured output (so a checkpoint always names
them all); ``rollback`` truncates each to its checkpointed position. Together with the runtime's
commit order this gives exactly-once outputs for file and JSON-lines streams.
"""

from __future__ import annotations

from typing import Any, Mapping

from localstate.core.config import JobConfig
from localstate.core.task import OutgoingMessage
from localstate.errors import TaskError

from .base import OutputStream, open_output

__all__ = ["StreamSink"]


class StreamSink:
    """Writes task outputs to the job's ``[outputs.*]`` streams."""

    def __init__(self, job: JobConfig) -> None:
        self.job = job
        self.outputs: dict[str, OutputStream] = {name: open_output(job, name) for name in sorted(job.outputs)}
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

    def rollback(self, partition: int, positions: Mapping[str, int]) -> None:
        for name, output in self.outputs.items():
            output.truncate(partition, positions.get(name, 0))

    def close(self) -> None:
        for output in self.outputs.values():
            output.close()
