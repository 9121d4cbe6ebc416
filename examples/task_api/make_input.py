"""Write the example's input: messages keyed by user, in the partition of their key."""

from pathlib import Path

from localstate.core.partitioner import partition_for
from localstate.streams.jsonl import write_jsonl

HERE = Path(__file__).resolve().parent
MESSAGES = [("ada", "the cat sat"), ("bob", "the dog ran"), ("ada", "the cat ran"), ("cy", "hello"),
            ("bob", "the end")]

for user, text in MESSAGES:
    write_jsonl(HERE / "in", partition_for(user, 2), [{"key": user, "value": {"text": text}}])
print(f"wrote {len(MESSAGES)} messages to {HERE / 'in'}")
