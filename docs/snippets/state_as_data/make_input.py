"""Write clicks FIRST..FIRST+COUNT-1 as a jsonl input laid out for PARTITIONS partitions:
`python make_input.py PARTITIONS FOLDER FIRST COUNT` (each click to its user's partition)."""

import sys

from localstate.core.partitioner import partition_for
from localstate.streams.jsonl import write_jsonl

partitions, folder, first, count = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
clicks = [{"key": f"user-{(i * 7) % 50}", "value": {"page": f"/p{i % 9}"}} for i in range(first, first + count)]
for partition in range(partitions):
    write_jsonl(folder, partition, [c for c in clicks if partition_for(c["key"], partitions) == partition])
print(f"wrote {count} clicks to {folder} ({partitions} partitions)")
