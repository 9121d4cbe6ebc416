"""Quix Streams' tumbling-window count on the timestamped counting workload (run by ``bench
windows`` with a Python that has quixstreams; never imported by localstate).

Each event goes through Quix's own window operator (``FixedTimeWindow.process_window``, what
``sdf.tumbling_window(...).count().final(closing_strategy="partition")`` runs per message) on a
windowed RocksDB store partition, one transaction per ``--commit-every`` events, as Quix's
checkpointing does; no Kafka (the consumer and producer are not measured, as on localstate's side).
Prints ``<events/s> ops/s``, the windows emitted and the sum of their counts."""

import argparse
import os
import shutil
import sys
import tempfile
import time
import warnings

warnings.filterwarnings("ignore")

from quixstreams.dataframe.windows.aggregations import Count  # noqa: E402
from quixstreams.dataframe.windows.time_based import ClosingStrategy, FixedTimeWindowSingleAggregation  # noqa: E402
from quixstreams.state.rocksdb.windowed.partition import WindowedRocksDBStorePartition  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("--peers", required=True, help="the shared peers folder (workload.py)")
parser.add_argument("--events", type=int, default=1_000_000)
parser.add_argument("--keys", type=int, default=50_000)
parser.add_argument("--commit-every", type=int, default=10_000)
parser.add_argument("--rate", type=float, default=1000.0, help="events per second of event time")
parser.add_argument("--window", type=float, default=300.0, help="window size, seconds")
parser.add_argument("--start", type=float, default=1_700_000_000.0)
args = parser.parse_args()
sys.path.insert(0, args.peers)
from workload import keys as workload_keys  # noqa: E402

keys = [k.encode() for k in workload_keys(args.events, args.keys)]
stamps = [int((args.start + i / args.rate) * 1000) for i in range(args.events)]

window = FixedTimeWindowSingleAggregation(duration_ms=int(args.window * 1000), grace_ms=0, name="tumbling",
                                          dataframe=None, aggregators={"value": Count()}, collectors={})
window._closing_strategy = ClosingStrategy.PARTITION  # closed by the partition's event time, as a watermark

tmp = tempfile.mkdtemp()
partition = WindowedRocksDBStorePartition(path=os.path.join(tmp, "windows"))
emitted = counted = 0
started, cpu_started = time.perf_counter(), time.process_time()
tx = partition.begin()
process = window.process_window
for i, (key, ts) in enumerate(zip(keys, stamps), 1):
    _, closed = process(1, key, ts, None, tx)
    for _, result in closed:
        emitted += 1
        counted += result["value"]
    if i % args.commit_every == 0:
        tx.prepare()
        tx.flush()
        tx = partition.begin()
        process = window.process_window
tx.prepare()
tx.flush()
seconds, cpu_seconds = time.perf_counter() - started, time.process_time() - cpu_started
partition.close()
shutil.rmtree(tmp)
print(f"quixstreams tumbling count\t{args.events / seconds:,.0f} ops/s\t{seconds:.3f} s\tcpu {cpu_seconds:.3f} s\t"
      f"windows {emitted}\tcounted {counted}")
