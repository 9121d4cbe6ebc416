import tempfile
from pathlib import Path

from localstate.changelog.file import FileChangelogSystem, compact_stream

state_dir = Path(tempfile.mkdtemp())
system = FileChangelogSystem({"segment_bytes": "1MB"}, state_dir)   # options are validated
system.ensure_stream("counts", partitions=2)                         # records the partition count

log = system.partition("counts", 0)          # the single writer of partition 0 (flock'ed)
log.append(b"apple", b"3")
log.append_many([(b"pear", b"1"), (b"apple", None)])   # None = tombstone (the key was deleted)
assert log.end_offset() == 3                 # counts unflushed appends
assert log.flush() == 3                      # durable (fsync) -> returns the next offset

for record in log.read(start=1):             # ChangelogRecord(key, value, offset), offset order
    print(record.offset, record.key, record.value)
for batch in log.read_batches():             # the same records in lists (bulk path)
    print(len(batch))
for run in log.read_columns():               # RecordColumns: keys[i] -> values[i], no object per record
    print(len(run.keys), run.end)            # (the restore path; same checks and errors as read())

reader = system.reader("counts", 0)          # lock-free reader; works from any process
print(reader.end_offset(), [r.offset for r in reader.read()])

end = log.flush()
log.close()                                  # no writer: compaction seals the active segment too
stats = compact_stream(system, "counts", {0: end})   # keep the last record per key below `end`
print(stats.records_before, "->", stats.records_after)   # 3 -> 2
system.close()
