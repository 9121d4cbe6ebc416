"""Co-partitioning checked where records are read: job partition ``p`` reads input partition ``p``,
so a keyed record must sit in the partition :func:`~localstate.core.partitioner.partition_for` gives
its key, or its state would be kept by another task partition than the one its key's other records
reach (one key counted in two stores, silently).

An input that places records by key (jsonl, file, kafka) has ``on_misrouted``: ``fail`` (default: a
:class:`~localstate.errors.MisroutedRecordError` naming the input, partition, offset, key and the
partition it belongs to), ``skip`` (counted), ``dead_letter`` (to the input's ``dead_letter``
output, as bad records go), ``route`` (sent to the partition it belongs to: only where the runtime
can do that, the TaskTestDriver; ``localstate run`` reads each input partition in its own task and
refuses it), or ``allow`` (not checked: an input whose keys are not what the task keeps state by,
each partition's records processed where they are). Misrouted records are counted per input (``misrouted`` in progress, ``localstate
status``, Prometheus). The check costs a partition per distinct key of a chunk (remembered across
chunks), and nothing with one job partition."""

from __future__ import annotations

import json
from itertools import islice
from typing import Any, Iterator, Mapping

from localstate.core.options import Option
from localstate.core.partitioner import partitions_of
from localstate.core.event_time import RecordProblem
from localstate.errors import MisroutedRecordError
from localstate.core.stream import InputColumns, InputRecord

__all__ = ["ON_MISROUTED", "ROUTING_OPTIONS", "MISROUTED", "RoutingCheck", "misrouted_problem", "misrouted_record"]

ON_MISROUTED = ("fail", "skip", "dead_letter", "route", "allow")

MISROUTED = "misrouted"
"""The kind of count (:class:`~localstate.core.task.TaskCounters`) of misrouted records, per input."""

ROUTING_OPTIONS: Mapping[str, Option] = {
    "on_misrouted": Option(str, default="fail", choices=ON_MISROUTED,
                           doc="a keyed record in another partition than its key's (partition_for): fail the job "
                               "(naming the record and the partition it belongs to), skip it (counted), write it to "
                               "the `dead_letter` output, route it to its partition (the TaskTestDriver only: "
                               "`localstate run` refuses route), or allow it (not checked: the input's keys are "
                               "not what the task keeps state by)"),
}
"""Options of every input that places its records by key."""

_CHUNK = 256


def misrouted_problem(stream: str, key: Any, owner: int, policy: str) -> RecordProblem:
    """The error of a misrouted record of input ``stream`` whose key belongs to partition ``owner``,
    handled by ``policy`` (the input's ``on_misrouted``) instead of ``on_error``."""
    shown = repr(key)
    shown = shown if len(shown) <= 100 else shown[:97] + "..."
    return RecordProblem(
        f"key {shown} belongs to partition {owner} (partition_for), not this one: misrouted", MisroutedRecordError,
        hint=f"write each record to the partition of its key (Kafka's default partitioner, murmur2 of its key; "
             f"see docs/task-api.md), or set on_misrouted = 'skip' or 'dead_letter' in [inputs.{stream}]",
        policy=policy, counted_as=(MISROUTED, stream), key=shown, owner=owner)


def misrouted_record(record: Any, stream: str, owner: int, policy: str) -> Any:
    """``record`` (an InputRecord whose key belongs to partition ``owner``) as the bad record it is
    under ``policy``; its timestamp is kept (where inputs are merged by time it keeps its place)."""
    return record._replace(key=None, value=None, error=misrouted_problem(stream, record.key, owner, policy),
                           raw=_raw(record.key, record.value, record.ts))


def _raw(key: Any, value: Any, ts: Any) -> str:
    try:
        return json.dumps({"key": key, "value": value, "ts": ts}, separators=(",", ":"), sort_keys=True)[:1000]
    except (TypeError, ValueError):
        return repr((key, value, ts))[:1000]


class RoutingCheck:
    """The co-partitioning check of one input partition's records as they are read: misrouted ones
    become bad records whose error (:func:`misrouted_problem`) carries the input's ``on_misrouted``
    policy. Records and column chunks keep their offsets and order."""

    def __init__(self, stream: str, partition: int, partitions: int, policy: str) -> None:
        self.stream, self.partition, self.partitions, self.policy = stream, partition, partitions, policy

    @classmethod
    def of(cls, source: Any, partition: int) -> "RoutingCheck | None":
        """The check of ``source``'s (an InputStream's) ``partition``; None when there is nothing to
        check (an input that does not place records by key, one that allows any placement, or one
        job partition)."""
        policy = getattr(source, "on_misrouted", None)
        partitions = source.job.partitions
        if policy is None or policy == "allow" or partitions <= 1:
            return None
        return cls(source.name, partition, partitions, policy)

    def records(self, records: Iterator[Any]) -> Iterator[Any]:
        """``records`` (InputRecords), the misrouted ones as bad records; keys checked a chunk at a time."""
        records = iter(records)
        while True:
            chunk = list(islice(records, _CHUNK))
            if not chunk:
                return
            keyed = [record for record in chunk if record.error is None and record.key is not None]
            owners = partitions_of([record.key for record in keyed], self.partitions) if keyed else []
            if all(owner == self.partition for owner in owners):
                yield from chunk
                continue
            wrong = {id(record): owner for record, owner in zip(keyed, owners) if owner != self.partition}
            for record in chunk:
                owner = wrong.get(id(record))
                yield record if owner is None else misrouted_record(record, self.stream, owner, self.policy)

    def columns(self, chunks: Iterator[Any]) -> Iterator[Any]:
        """Column chunks (InputColumns), each with its misrouted rows moved to ``bad``."""
        for columns in chunks:
            keys = columns.keys
            if not len(keys):
                yield columns
                continue
            owners = partitions_of(keys, self.partitions)
            if isinstance(owners, list):
                wrong = [i for i, owner in enumerate(owners) if owner != self.partition]
            else:
                # CLI start-up: --help loads this module, not pyarrow (only input columns need it)
                import pyarrow.compute as pc

                if pc.all(pc.equal(owners, self.partition)).as_py():
                    wrong = []
                else:
                    wrong = [i for i, owner in enumerate(owners.to_pylist()) if owner != self.partition]
            yield self._without(columns, wrong, owners) if wrong else columns

    def _without(self, columns: Any, wrong: list[int], owners: Any) -> Any:
        """``columns`` with rows ``wrong`` moved to its bad records."""
        owners = owners if isinstance(owners, list) else owners.to_pylist()
        values = [c if isinstance(c, list) else c.to_pylist() for c in (columns.keys, columns.values,
                                                                          columns.timestamps)]
        offsets = list(columns.offsets)
        dropped = set(wrong)
        bad = list(columns.bad) + [
            InputRecord(offsets[i], None, None, None,
                        misrouted_problem(self.stream, values[0][i], owners[i], self.policy),
                        _raw(values[0][i], values[1][i], values[2][i])) for i in wrong]
        bad.sort(key=lambda record: record.offset)
        kept = [i for i in range(len(offsets)) if i not in dropped]
        keys, vals, times = ([column[i] for i in kept] for column in values)
        return InputColumns([offsets[i] for i in kept], keys, vals, times, bad, columns.end)
