"""Merge out-of-order logs into one totally ordered log with a changelog-backed reorder buffer
(``engine = "heap"``, ``kind = "reorder"``), driven directly (no runtime, no Spark).

    python examples/heap/direct/merge_logs.py [STATE_DIR]

Three servers ship log lines whose timestamps (epoch milliseconds) arrive up to 2 seconds out of
order. The buffer releases lines once the watermark (newest timestamp - ``max_lateness``) passes
them, so the merged output is sorted; lines later than that are collected by
``late_policy = "side_output"`` instead of breaking the order.
"""

from __future__ import annotations

import random
import sys
import tempfile
from pathlib import Path

from localstate.changelog.file import FileChangelogPartition
from localstate.core.engine import StoreContext
from localstate.runtime.partition.recovery import recover_store
from localstate.core.serdes import BytesSerde, JsonSerde
from localstate.engines.heap import HeapEngineFactory


def shipped_lines(seed: int = 11) -> list[dict]:
    """Lines in arrival order: each server's clock is fine, but delivery is delayed by up to 2.5 s."""
    rng = random.Random(seed)
    lines = []
    for server in ("web-1", "web-2", "db-1"):
        for n in range(400):
            ts = 1_700_000_000_000 + n * 50 + rng.randrange(50)
            lines.append({"ts": ts, "arrives": ts + rng.randrange(2500), "server": server, "msg": f"req {n}"})
    lines.sort(key=lambda line: line["arrives"])
    return lines


def main(argv: list[str]) -> int:
    state = Path(argv[0]) if argv else Path(tempfile.mkdtemp(prefix="merge-logs-"))
    factory = HeapEngineFactory()
    options = factory.validate_options("merged", {"kind": "reorder", "max_lateness": "2s",
                                                  "timestamp_unit": "ms", "late_policy": "side_output"})
    changelog = FileChangelogPartition(state / "changelog", "merged-changelog", 0)
    (state / "store").mkdir(parents=True, exist_ok=True)
    context = StoreContext(job="merge", store="merged", partition=0, directory=state / "store", options=options,
                           key_serde=BytesSerde(), value_serde=JsonSerde(), changelog=changelog)
    buffer = factory.create(context)
    recover_store(buffer, changelog, changelog.end_offset(), label="merged[0]")

    merged, late = [], []
    for n, line in enumerate(shipped_lines(), 1):
        buffer.push({"server": line["server"], "msg": line["msg"]}, line["ts"])
        merged += buffer.drain()  # everything older than newest - 2 s, in timestamp order
        late += buffer.take_late()
        if n % 200 == 0:
            buffer.flush()  # commit: only lines still buffered are in the changelog
    merged += buffer.drain_until(float("inf"))  # end of input: release the rest
    buffer.flush()
    buffer.close()
    changelog.close()

    stamps = [event.timestamp for event in merged]
    assert stamps == sorted(stamps), "output must be totally ordered"
    assert len(merged) + len(late) == 1200, "no line lost or duplicated"
    for event in merged[:5]:
        print(event.timestamp, event.event["server"], event.event["msg"])
    print(f"... {len(merged)} lines merged in timestamp order, {len(late)} late line(s) side-output")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
