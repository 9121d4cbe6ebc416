"""Test input for the counting jobs (``count_task:CountByKey``): events keyed by a list of keys,
split by the job's partitioner into one JSON-lines file per partition."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from localstate.core.partitioner import partition_for
from localstate.streams.jsonl import write_jsonl

__all__ = ["write_keyed_events"]


def write_keyed_events(data: Path, keys: Sequence[str], partitions: int = 2, per_partition: int | None = None) -> None:
    """Write partition p's share of ``keys`` (in order, at most ``per_partition``) to ``data/p.jsonl``
    as records ``{"key", "value": i, "ts": 1_700_000_000.0 + i}``, ``i`` the record's offset in the
    partition (event times in 2023: inside every input's default plausible range)."""
    for partition in range(partitions):
        mine = [k for k in keys if partition_for(k, partitions) == partition][:per_partition]
        write_jsonl(data, partition, [{"key": k, "value": i, "ts": 1_700_000_000.0 + i} for i, k in enumerate(mine)])
