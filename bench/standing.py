"""A standing job: end-to-end latency at fixed input rates next to Spark Structured Streaming (JSON
lines) and Quix Streams (Kafka), idle CPU, and a soak run with worker kills.

    python -m bench standing [--json] [--quick] [--rates 1000,10000,50000] [--seconds S]
                             [--idle-seconds I] [--inputs jsonl,kafka] [--no-peer] [--no-quix]
                             [--quix-guarantee exactly-once] [--quix-commit-interval 0.1]
    python -m bench standing --minutes N [--kill-every SECONDS] [--rate R]      # soak (default 30, 10k/s)
    python -m bench standing --modes continuous --minutes N ...                  # soak continuous mode

Latency: events ``{"key": "user-%05d", "value": 1, "ts": i}`` (user ``i % users``) are appended to the
job's JSON-lines input at a fixed rate, in ticks of ``--tick`` seconds; the job (a count per user in a
RocksDB kv store, ``window()`` at the end of every batch sends each changed user's count to a ``jsonl``
output) is driven as a subprocess, ``localstate run JOB --master local[2]``. A watcher polls the
output files every 5 ms: when ``(user, count)`` appears, every event of that user up to its
``count``-th is visible, and its latency is the time from its append (after the write returned) to
then. p50 and p99 per rate, over every event of the rate's window (an event never seen counts as
``missing``).

Standing or bounded: if ``localstate run --help`` lists ``--until-drained``, ``run`` follows new input
(one process, stopped with SIGTERM at the end). Otherwise ``run`` stops when its inputs are consumed,
and the bench loops it (a new process, SparkContext and JVM per run): latencies then include a run's
start, which the output says (``mode``).

The peer: a Structured Streaming query in its own process (``local[2]``, the RocksDB state store with
changelog checkpointing, ``spark.sql.shuffle.partitions=2`` as in ../shared/peers/spark_peer.py):
``groupBy("key").count()``, output mode update, default trigger, over a JSON file source that gets the
same events, one new file per tick (written hidden, then renamed into place); each micro-batch's rows
are appended by ``foreachBatch`` as the same ``{"key","value"}`` lines to one file the same watcher
polls. Each system is warmed up (untimed) until its output shows a first batch of events.

Kafka (``--inputs kafka``, the default with jsonl): a Tansu dev broker (``DevBroker``, in memory,
loopback) for the whole Kafka part; each system gets an input and an output topic of two partitions.
The same events are produced by this process (``produce``: ``acks=all``, one call per tick, each
record in its key's murmur2 partition) and their time is taken when the call returns, every record
acknowledged. localstate runs the same job with ``system = "kafka"`` input and output (it writes its
outputs at each commit); Quix Streams (bench/quix_standing_peer.py, run by the Python of
``/tmp/localstate-peers`` or ``PEERS_VENV``, as a process of its own) counts per key with
``processing_guarantee="exactly-once"`` (``--quix-guarantee``) and ``commit_interval`` 0.1 s
(``--quix-commit-interval``; Quix's default is 5 s) and sends each record's new count. A
``read_committed`` consumer in this process reads the output topic: an event is visible when the
count that covers it is received, so a transactional writer's outputs count from their commit.
``written_per_s`` says what the producer managed (kafka-python in one process: it can fall short of
the rate on a busy machine). The broker's own CPU is not in any system's idle CPU.

Idle CPU: after the rates, no new input for ``--idle-seconds``; CPU seconds of the process tree (the
driver, its JVM, the Python workers) over that time, as % of one core. The window starts
``IDLE_SETTLE`` seconds after the outputs caught up, for every system alike: what a system still does
just after its last record (continuous mode keeps probing a busy Kafka input for a second) is not
what it costs while it idles for hours.

Soak (``--minutes N``): ``--rate`` events/s (default 10k) for N minutes, a Python worker SIGKILLed
every ``--kill-every`` seconds (default: six kills a run, every 5 minutes of 30); RSS of the driver
processes (Python driver + JVM; the JVM's alone too) and of the Python workers sampled every 5 s,
first third vs last third, as the mean of each third and as its peak (a warm-up in the first minutes
or a sawtooth, such as memtables filling and flushing or a killed worker replaced by a fresh one, moves
the means; growth that goes on moves both), with the RSS by minute in the notes; open fds of the driver processes; checkpoint and changelog bytes (first third vs last third),
the file changelog compacted every ``--compact-every`` seconds (default: a third of the run, its own
default of 10 minutes in 30); the restore after the first kill vs the last (records, ms;
progress.jsonl: a killed worker's retry usually finds its local store at the checkpoint and restores
nothing) and a cold restore's read of partition 0's changelog before the first kill vs before the
last (records read and decoded, ms); at the end (job stopped) every user's count in the store
(``localstate inspect --store counts``) and the last count per user in the outputs equal the counts
of the events written.

Every process the bench starts dies with it, and its whole process group is gone (waited for, then
SIGKILLed) before the bench goes on: nothing is left behind, not even a JVM whose driver has exited.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.report import Report
from localstate.core.partitioner import partition_for
from localstate.streams.jsonl import read_jsonl

REPO = Path(__file__).resolve().parents[1]
# Every process the bench starts gets SIGTERM when the bench dies, however it dies (a SIGKILL, a
# `timeout`): each runs in a session of its own (so that a Ctrl-C of the bench does not reach it
# before the bench stops it in order), and without this a standing `localstate run` or the Structured
# Streaming query, with its JVM, would run on forever once the bench is gone.
DIE_WITH_PARENT = ("import ctypes, os, signal, sys; ctypes.CDLL(None).prctl(1, signal.SIGTERM); "  # PR_SET_PDEATHSIG
                   "os.getppid() == int(os.environ.get('BENCH_PARENT', os.getppid())) or sys.exit(143); ")
CLI = [sys.executable, "-c", DIE_WITH_PARENT + "from localstate.tools.cli import main; sys.exit(main())"]
GROUP_GRACE = 30.0
"""seconds a stopped child's process group (its JVM, Python workers) gets to end after the child exited"""

TASK = '''
from localstate import StreamTask


class DirtyCounts(StreamTask):
    """Counts per user; at the end of every batch, each changed user's count goes to ``counts``."""

    def init(self, context):
        self.counts = context.store("counts")
        self.dirty = {}

    def process(self, envelope, collector, coordinator):
        count = (self.counts.get(envelope.key) or 0) + 1
        self.counts.put(envelope.key, count)
        self.dirty[envelope.key] = count

    def window(self, collector, coordinator):
        for key, count in self.dirty.items():
            collector.send("counts", key, count)
        self.dirty.clear()
'''

JOB = '''
[job]
name = "standing-bench"
partitions = 2
task = "standing_task:DirtyCounts"
window_interval = "0s"
state_dir = "state"
pythonpath = ["."]

{io}
[stores.counts]
engine = "kv"
backend = "rocksdb"
key_serde = "string"
value_serde = "int"

[spark]
master = "local[2]"
'''


JSONL_IO = '''
[inputs.events]
system = "jsonl"
path = "data"

[outputs.counts]
system = "jsonl"
path = "out"
'''

KAFKA_IO = '''
[inputs.events]
system = "kafka"
topic = "{events}"
bootstrap_servers = "{servers}"

[outputs.counts]
system = "kafka"
topic = "{counts}"
bootstrap_servers = "{servers}"
'''
"""The Kafka variant of the job: the same task reading a topic and writing its counts to a topic (the
bench creates both, two partitions each)."""


# -- processes ---------------------------------------------------------------------------------------------

def _children() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    parent = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            tree.setdefault(parent, []).append(int(entry))
    return tree


def _tree(pid: int) -> list[int]:
    tree, found, frontier = _children(), [pid], [pid]
    while frontier:
        frontier = [c for p in frontier for c in tree.get(p, [])]
        found += frontier
    return found


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _cpu(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _tree_cpu(pid: int) -> dict[int, float]:
    return {p: _cpu(p) for p in _tree(pid)}


def _rss_mb(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def _fds(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return 0


def _roles(pid: int) -> tuple[list[int], list[int]]:
    """(driver processes: the Python driver and its JVM; Python workers: everything below the JVM that
    runs pyspark's daemon or worker)."""
    driver, workers = [], []
    for p in _tree(pid):
        line = _cmdline(p)
        if "pyspark.daemon" in line or "pyspark.worker" in line:
            workers.append(p)
        elif p == pid or "java" in line.split(" ", 1)[0]:
            driver.append(p)
    return driver, workers


def _forked_workers(pid: int) -> list[int]:
    """The forked Python workers (each a pyspark.daemon whose parent is a pyspark.daemon too): the
    processes that run tasks and keep partitions open, one per busy or kept task slot."""
    tree = _children()
    for p in _tree(pid):
        if "pyspark.daemon" in _cmdline(p):
            kids = [c for c in tree.get(p, []) if "pyspark.daemon" in _cmdline(c)]
            if kids:
                return kids
    return []


def _worker_to_kill(pid: int) -> int | None:
    """A forked Python worker (see :func:`_forked_workers`)."""
    forked = _forked_workers(pid)
    return forked[-1] if forked else None


def _group_alive(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _spawn(command: list[str], log: Path, cwd: Path | None = None) -> subprocess.Popen:
    """``command`` in a session of its own (its process group is its pid), dying with the bench."""
    return subprocess.Popen(command, stdout=open(log, "a"), stderr=subprocess.STDOUT, cwd=cwd,
                            start_new_session=True, env={**os.environ, "BENCH_PARENT": str(os.getpid())})


def _stop_group(proc: subprocess.Popen, sig: int, timeout: float) -> tuple[int, int]:
    """Send ``sig`` to ``proc``, wait for it (``timeout``, then SIGKILL to its whole group), then for
    every process left in its group: a JVM whose Python driver has exited lives on for a while (its
    shutdown hooks), reparented to init, out of reach of ``proc.wait()``. Whatever is still there after
    :data:`GROUP_GRACE` is SIGKILLed: the bench leaves nothing behind. ``(exit code, processes
    SIGKILLed after the grace)``."""
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    deadline = time.monotonic() + GROUP_GRACE
    while _group_alive(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = _group_members(proc.pid)
    if left:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return proc.returncode, len(left)


def _group_members(group: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[2]) == group:
                        found.append(int(entry))
            except (OSError, IndexError, ValueError):
                continue
    return found


# -- input and output ----------------------------------------------------------------------------------------

class Events:
    """Appends events at a fixed rate to the job's JSON-lines input (or, for Structured Streaming, one
    new file per tick); remembers when each became visible to the system under test."""

    def __init__(self, root: Path | None, users: int, capacity: int, ss: bool, tick: float) -> None:
        self.root, self.users, self.ss, self.tick = root, users, ss, tick
        self.appended = np.full(capacity, np.nan)
        self.count = 0
        self.owner = [partition_for(f"user-{u:05d}", 2) for u in range(users)]
        self.files = 0

    def write(self, n: int) -> None:
        """Append the next ``n`` events; their time is taken once the write has returned."""
        start, end = self.count, self.count + n
        self._deliver(start, end)
        self.appended[start:end] = time.time()
        self.count = end

    def _deliver(self, start: int, end: int) -> None:
        lines: list[list[str]] = [[], []]
        for i in range(start, end):
            u = i % self.users
            lines[0 if self.ss else self.owner[u]].append(f'{{"key":"user-{u:05d}","value":1,"ts":{i}}}\n')
        if self.ss:
            hidden = self.root / "ss-in" / f".part-{self.files:06d}.json"
            hidden.write_text("".join(lines[0]))
            os.replace(hidden, self.root / "ss-in" / f"part-{self.files:06d}.json")
            self.files += 1
        else:
            for p in (0, 1):
                if lines[p]:
                    with open(self.root / "job" / "data" / f"{p}.jsonl", "a") as handle:
                        handle.write("".join(lines[p]))

    def run(self, rate: float, seconds: float, stop: threading.Event | None = None) -> tuple[int, int]:
        """Events of [start, end) appended at ``rate`` for ``seconds``."""
        first, began, ticks = self.count, time.monotonic(), int(round(seconds / self.tick))
        carry = 0.0
        for k in range(ticks):
            if stop is not None and stop.is_set():
                break
            delay = began + k * self.tick - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            carry += rate * self.tick
            n = int(carry)
            carry -= n
            if n:
                self.write(n)
        return first, self.count


class KafkaEvents(Events):
    """The same events produced to a Kafka topic of two partitions: key ``user-%05d``, value
    ``{"value": 1, "ts": i}``, each in its key's murmur2 partition (what a Kafka input requires). A
    tick's events are one produce call; their time is taken when it returns, every record acknowledged
    (``acks=all``)."""

    def __init__(self, settings: dict, topic: str, users: int, capacity: int, tick: float) -> None:
        super().__init__(None, users, capacity, False, tick)
        self.settings, self.topic = settings, topic
        self.keys = [f"user-{u:05d}".encode() for u in range(users)]

    def _deliver(self, start: int, end: int) -> None:
        from localstate.changelog.kafka.io import produce

        # A long linger costs no latency here (produce() ends with flush(), which sends at once) and
        # fills batches while the tick's records are sent: ~20% less CPU per record than linger 0.
        produce(self.settings, self.topic, ((self.keys[i % self.users], b'{"value":1,"ts":%d}' % i,
                                             self.owner[i % self.users]) for i in range(start, end)), linger=0.05)


class OutputEvents(Events):
    """The reader's floor: each event written straight to the job's *output* as the count it makes
    (user ``i % users``'s ``i // users + 1``-th), one append per partition and tick, so the
    latency is from that write to the reader seeing it, with nothing in between."""

    def _deliver(self, start: int, end: int) -> None:
        lines: list[list[str]] = [[], []]
        for i in range(start, end):
            u = i % self.users
            lines[self.owner[u]].append(f'{{"key":"user-{u:05d}","value":{i // self.users + 1}}}\n')
        for p in (0, 1):
            if lines[p]:
                with open(self.root / "job" / "out" / f"{p}.jsonl", "a") as handle:
                    handle.write("".join(lines[p]))


class KafkaOutputEvents(Events):
    """The reader's floor on Kafka: each tick's counts (as :class:`OutputEvents`) produced straight to
    the output topic in one transaction; their time is taken when its commit returns."""

    def __init__(self, settings: dict, topic: str, users: int, capacity: int, tick: float) -> None:
        from kafka import KafkaProducer

        super().__init__(None, users, capacity, False, tick)
        self.topic = topic
        self.producer = KafkaProducer(**settings, acks="all", enable_idempotence=True, linger_ms=5,
                                      transactional_id=f"bench-reader-floor-{topic}")
        self.producer.init_transactions()

    def _deliver(self, start: int, end: int) -> None:
        self.producer.begin_transaction()
        for i in range(start, end):
            u = i % self.users
            self.producer.send(self.topic, key=b"user-%05d" % u, value=b"%d" % (i // self.users + 1),
                               partition=self.owner[u])
        self.producer.commit_transaction()


class Idle:
    """No system: what the reader's floor rows measure against (the events are their own outputs)."""

    proc = None
    leftovers = 0

    def start(self) -> None:
        pass

    def stop(self) -> int:
        return 0

    def pid(self) -> int:
        return os.getpid()


class Watcher(threading.Thread):
    """Polls output files for ``{"key","value"}`` lines and records when each event became visible.
    A directory among ``files`` stands for every ``*.jsonl`` in it (an output's later segments)."""

    def __init__(self, files: list[Path], events: Events) -> None:
        super().__init__(daemon=True)
        self.files, self.events = files, events
        self.offsets: dict[Path, int] = {}
        self.seen = np.zeros(events.users, dtype=np.int64)
        self.visible = np.full(events.appended.shape[0], np.nan)
        self.stop = threading.Event()

    def saw(self, u: int, count: int, now: float) -> None:
        """User ``u``'s count ``count`` is visible at ``now``: so is every event of ``u`` up to its
        ``count``-th (the first time a count that high shows)."""
        if count > self.seen[u]:
            index = np.arange(self.seen[u], count) * self.events.users + u
            index = index[index < self.visible.shape[0]]
            fresh = index[np.isnan(self.visible[index])]
            self.visible[fresh] = now
            self.seen[u] = count

    def poll(self) -> None:
        now = time.time()
        paths = [q for f in self.files for q in (sorted(f.glob("*.jsonl")) if f.is_dir() else [f])]
        for path in paths:
            try:
                size = path.stat().st_size
            except FileNotFoundError:
                continue
            self.offsets.setdefault(path, 0)
            if size < self.offsets[path]:
                self.offsets[path] = size  # rolled back (a retried batch): read what is written next
            if size == self.offsets[path]:
                continue
            with open(path, "rb") as handle:
                handle.seek(self.offsets[path])
                data = handle.read(size - self.offsets[path])
            cut = data.rfind(b"\n") + 1
            self.offsets[path] += cut
            for line in data[:cut].splitlines():
                record = json.loads(line)
                self.saw(int(record["key"][5:]), int(record["value"]), now)

    def run(self) -> None:
        while not self.stop.is_set():
            self.poll()
            time.sleep(0.001)
        self.poll()
        self.close()

    def close(self) -> None:
        """Nothing to release: files are read and closed at each poll."""

    def caught_up(self, upto: int, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if upto == 0 or not np.isnan(self.visible[:upto]).any():
                return True
            time.sleep(0.05)
        return False


def _read_committed(settings: dict, topic: str, seen: Any, stop: Any) -> None:
    """A :class:`KafkaWatcher`'s reader, in a process of its own (dying with the bench):
    ``(time received, [(user, count)])`` of every poll that returned records, until ``stop``; None at
    the end."""
    import ctypes

    from kafka import KafkaConsumer, TopicPartition

    ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG, as DIE_WITH_PARENT

    from localstate.changelog.kafka.io import consumer_settings

    # fetch_max_wait_ms: a fetch finding nothing new comes back within 5 ms, as the file watcher polls.
    consumer = KafkaConsumer(**consumer_settings(settings, isolation_level="read_committed",
                                                 auto_offset_reset="earliest", fetch_max_wait_ms=5))
    consumer.assign([TopicPartition(topic, p) for p in (0, 1)])
    seen.put(())  # assigned: the caller may go on
    try:
        while not stop.is_set():
            batches = consumer.poll(timeout_ms=5)
            now = time.time()
            counts = [(int(r.key[5:]), int(r.value)) for records in batches.values() for r in records]
            if counts:
                seen.put((now, counts))
    finally:
        consumer.close()
        seen.put(None)


class KafkaWatcher(Watcher):
    """Reads an output topic (both partitions, from the start) with a ``read_committed`` consumer: a
    record counts as visible when this reader receives it, so a transactional writer's records count
    from their transaction's commit. Keys are ``user-%05d``, values the count as JSON. The consumer
    runs in a process of its own (:func:`_read_committed`), which takes the time a record arrives: in
    this process it would wait for the GIL behind the producer (kafka-python, ~50 µs of Python per
    record: tens of milliseconds a tick at 10k events/s)."""

    def __init__(self, settings: dict, topic: str, events: Events) -> None:
        import multiprocessing

        super().__init__([], events)
        context = multiprocessing.get_context("spawn")  # this process runs client threads: no fork
        self.queue, self.done = context.Queue(), context.Event()
        self.reader = context.Process(target=_read_committed, args=(dict(settings), topic, self.queue, self.done),
                                      daemon=True)
        self.reader.start()
        self.queue.get(timeout=120)

    def poll(self) -> None:
        import queue

        try:
            item = self.queue.get(timeout=0.005)
        except queue.Empty:
            return
        while item:
            now, counts = item
            for u, count in counts:
                self.saw(u, count, now)
            try:
                item = self.queue.get_nowait()
            except queue.Empty:
                return
        if item is None:
            self.queue.put(None)  # the reader ended: keep saying so

    def close(self) -> None:
        self.done.set()
        # Drain what the reader still sends, up to its end marker, so that it can exit.
        deadline = time.monotonic() + 30
        while self.reader.is_alive() and time.monotonic() < deadline:
            self.poll()
        self.reader.join(5)
        if self.reader.is_alive():
            self.reader.kill()


def _latency(events: Events, watcher: Watcher, first: int, end: int) -> dict[str, float]:
    appended, visible = events.appended[first:end], watcher.visible[first:end]
    ok = ~np.isnan(visible)
    lat = (visible[ok] - appended[ok]) * 1000.0
    return {"events": int(end - first), "missing": int((~ok).sum()),
            "p50_ms": float(np.percentile(lat, 50)) if lat.size else float("nan"),
            "p99_ms": float(np.percentile(lat, 99)) if lat.size else float("nan"),
            "p99_9_ms": float(np.percentile(lat, 99.9)) if lat.size else float("nan"),
            "max_ms": float(lat.max()) if lat.size else float("nan")}


# -- the systems -----------------------------------------------------------------------------------------------

def standing_supported() -> bool:
    """Whether ``localstate run`` follows new input (it knows ``--until-drained``)."""
    done = subprocess.run(CLI + ["run", "--help"], capture_output=True, text=True, timeout=120)
    return "--until-drained" in done.stdout


class Localstate:
    """``localstate run`` as a subprocess: one standing process, or bounded runs looped."""

    def __init__(self, root: Path, standing: bool, log: Path) -> None:
        self.root, self.standing, self.log = root, standing, log
        self.job = root / "job" / "job.toml"
        self.proc: subprocess.Popen | None = None
        self.runs = 0
        self._stop = threading.Event()
        self._loop: threading.Thread | None = None
        self.failures: list[int] = []
        self.leftovers = 0  #: processes of its group SIGKILLed after the grace at the stop

    def _start_one(self) -> subprocess.Popen:
        self.runs += 1
        return _spawn(CLI + ["run", str(self.job), "--master", "local[2]"], self.log, cwd=self.root / "job")

    def start(self) -> None:
        if self.standing:
            self.proc = self._start_one()
            return

        def loop() -> None:
            while not self._stop.is_set():
                self.proc = self._start_one()
                code = self.proc.wait()
                if code != 0:
                    self.failures.append(code)
                    time.sleep(1.0)

        self._loop = threading.Thread(target=loop, daemon=True)
        self._loop.start()
        while self.proc is None:
            time.sleep(0.01)

    def pid(self) -> int:
        return self.proc.pid if self.proc is not None else 0

    def stop(self) -> int:
        self._stop.set()
        code = 0
        if self.proc is not None:
            code, self.leftovers = _stop_group(self.proc, signal.SIGTERM if self.standing else signal.SIGINT, 120)
        if self._loop is not None:
            self._loop.join(timeout=180)
        return code


SS_QUERY = '''
import json, signal, sys, time
from pyspark.sql import SparkSession
root = sys.argv[-1]
stopping = []
signal.signal(signal.SIGTERM, lambda *_: stopping.append(1))
spark = (SparkSession.builder.master("local[2]").appName("standing-peer")
         .config("spark.sql.shuffle.partitions", "2")
         .config("spark.sql.streaming.stateStore.providerClass",
                 "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider")
         .config("spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled", "true")
         .config("spark.ui.enabled", "false").getOrCreate())
spark.sparkContext.setLogLevel("ERROR")
out = open(root + "/ss-out.jsonl", "a")

def sink(frame, batch_id):
    rows = frame.collect()
    out.write("".join(json.dumps({"key": r["key"], "value": int(r["count"])}) + "\\n" for r in rows))
    out.flush()

events = spark.readStream.schema("key string, value long, ts long").json(root + "/ss-in")
query = (events.groupBy("key").count().writeStream.outputMode("update").foreachBatch(sink)
         .option("checkpointLocation", root + "/ss-checkpoint").start())
print("started", flush=True)
while not stopping and query.isActive:  # SIGTERM: stop the query and Spark, then exit (the JVM with it)
    query.awaitTermination(0.5)
query.stop()
spark.stop()
'''


class PeerProcess:
    """A peer system as one process (``command``) in a session of its own, dying with the bench, stopped
    by SIGTERM (its own handler ends its query or app and exits), then its whole group waited for."""

    def __init__(self, command: list[str], log: Path) -> None:
        self.command, self.log = command, log
        self.proc: subprocess.Popen | None = None
        self.leftovers = 0

    def start(self) -> None:
        self.proc = _spawn(self.command, self.log)

    def pid(self) -> int:
        return self.proc.pid if self.proc is not None else 0

    def stop(self) -> int:
        if self.proc is None:
            return 0
        code, self.leftovers = _stop_group(self.proc, signal.SIGTERM, 60)
        return code


class StructuredStreaming(PeerProcess):
    """The Structured Streaming query (:data:`SS_QUERY`) over the files in ``root/ss-in``."""

    def __init__(self, root: Path, log: Path) -> None:
        (root / "ss-in").mkdir()
        (root / "ss_query.py").write_text(SS_QUERY)
        super().__init__([sys.executable, "-c", DIE_WITH_PARENT + "exec(open(sys.argv[1]).read())",
                          str(root / "ss_query.py"), str(root)], log)


FLOOR = REPO / "bench" / "standing_floor.py"


class Floor(PeerProcess):
    """The floor (bench/standing_floor.py): the job's reads, counts and durable commit steps without
    Spark, a store or a task, one process per partition, on ``--input jsonl`` (the job folder under
    ``root``) or ``kafka`` (``kafka``: servers, input and output topics)."""

    def __init__(self, root: Path, log: Path, kafka: tuple[str, str, str] | None = None) -> None:
        command = [sys.executable, "-c", DIE_WITH_PARENT + RUN_SCRIPT, str(FLOOR), "--root", str(root / "job")]
        if kafka is None:
            command += ["--input", "jsonl"]
        else:
            servers, events, counts = kafka
            command += ["--input", "kafka", "--servers", servers, "--events", events, "--output", counts]
        super().__init__(command, log)


QUIX_PEER = REPO / "bench" / "quix_standing_peer.py"
RUN_SCRIPT = "import runpy; sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')"
"""Runs the script named after ``-c``'s code with the arguments after it (as ``python script ...``)."""


class QuixPeer(PeerProcess):
    """Quix Streams counting per key (bench/quix_standing_peer.py), run by a Python that has
    quixstreams; SIGTERM makes Quix end its current checkpoint and exit."""

    def __init__(self, root: Path, log: Path, python: str, servers: str, events: str, counts: str,
                 guarantee: str, commit_interval: float) -> None:
        super().__init__([python, "-c", DIE_WITH_PARENT + RUN_SCRIPT, str(QUIX_PEER), "--servers", servers,
                          "--input", events, "--output", counts, "--group", f"bench-{counts}",
                          "--state-dir", str(root / "quix-state"), "--guarantee", guarantee,
                          "--commit-interval", str(commit_interval)], log)


# -- the measurements ------------------------------------------------------------------------------------------

def _setup(root: Path, compact_interval: float | None = None, mode: str = "micro-batch",
           epoch: float | None = None, io: str = JSONL_IO) -> None:
    """The job's folder under ``root``: its task, its (empty) JSON-lines input files and its job.toml,
    with ``io`` as its input and output sections and ``mode`` as its ``[spark] mode``."""
    job = root / "job"
    (job / "data").mkdir(parents=True)
    (job / "out").mkdir()
    for p in (0, 1):
        (job / "data" / f"{p}.jsonl").touch()
    (job / "standing_task.py").write_text(TASK)
    compaction = f'\n[changelogs.file]\ncompact_interval = "{compact_interval:g}s"\n' if compact_interval else ""
    spark = f'mode = "{mode}"\n' if mode != "micro-batch" else ""
    spark += f'epoch = "{epoch:g}s"\n' if epoch is not None and mode == "continuous" else ""
    (job / "job.toml").write_text(JOB.replace("{io}", io) + spark + compaction)


def _restore_probe(job_file: Path) -> tuple[int, float]:
    """What a cold restore of partition 0's store reads, measured read-only next to the running job
    (as ``localstate inspect`` reads): every record of its changelog up to the committed checkpoint,
    read and decoded. ``(records, seconds)``."""
    from localstate.core.config import load_job_config
    from localstate.runtime.driver.views import changelog_records, checkpoint_manifest, load_checkpoints

    job = load_job_config(job_file)
    checkpoint = load_checkpoints(job).get(0)
    upto = checkpoint.changelogs.get("counts", 0) if checkpoint is not None else 0
    started = time.perf_counter()
    records = sum(1 for _ in changelog_records(job, job.stores["counts"].changelog, 0, 0, upto,
                                               checkpoint_manifest(checkpoint, "counts")))
    return records, time.perf_counter() - started


def _warm(events: Events, watcher: Watcher, system, n: int = 2000, timeout: float = 300.0) -> bool:
    """Start-up, untimed: until the output shows the first ``n`` events."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if events.count < n:
            events.write(n - events.count)
        if watcher.caught_up(events.count, 1.0):
            return True
        proc = getattr(system, "proc", None)
        looped = isinstance(system, Localstate) and not system.standing
        if proc is not None and proc.poll() is not None and not looped:
            return False
    return False


IDLE_SETTLE = 2.0
"""Seconds between the outputs catching up and the start of the idle CPU window."""


def _idle_cpu(system, seconds: float) -> float:
    """CPU of the system's process tree over ``seconds`` without new input, % of one core. Looped
    bounded runs: the runs that ended in the window count by their own CPU (reaped children), their
    JVMs only while they were seen live (a floor)."""
    def reaped() -> float:
        times = os.times()
        return times.children_user + times.children_system

    seen: dict[int, float] = {}
    base: dict[int, float] = {}
    before_reaped = reaped()
    deadline = time.monotonic() + seconds
    while True:
        for p, cpu in _tree_cpu(system.pid()).items():
            base.setdefault(p, cpu)
            seen[p] = cpu
        if time.monotonic() >= deadline:
            break
        time.sleep(0.5)
    used = sum(cpu - base[p] for p, cpu in seen.items())
    if isinstance(system, Localstate) and not system.standing:
        used += reaped() - before_reaped
    return 100.0 * used / seconds


def _throughput(events: Events, watcher: Watcher, burst: int, timeout: float = 600.0) -> float:
    """Sustained throughput, events/s: ``burst`` events appended at once, until the output shows them all."""
    began = time.monotonic()
    first = events.count
    for _ in range(0, burst, 50_000):
        events.write(min(50_000, first + burst - events.count))
    if not watcher.caught_up(events.count, timeout):
        return float("nan")
    return burst / (time.monotonic() - began)


def _capacity(rates: list[int], seconds: float, burst: int) -> int:
    """Events a latency run may write: every rate's window, the warm-up and the burst, with room to spare."""
    return int(sum(rates) * seconds * 1.1) + 200_000 + burst


def _file_trial(kind: str, root: Path, capacity: int, users: int, tick: float,
                standing: bool) -> tuple[object, Events, Watcher]:
    """``kind`` "spark" (Structured Streaming) or "localstate" (the job set up in ``root``) on the
    JSON-lines/file events, watched in its output files."""
    ss = kind == "spark"
    events = Events(root, users, capacity, ss, tick)
    log = root / f"{kind}.log"
    system = StructuredStreaming(root, log) if ss else Localstate(root, standing, log)
    return system, events, Watcher([root / "ss-out.jsonl"] if ss else [root / "job" / "out"], events)


def _kafka_topics(settings: dict, name: str) -> tuple[str, str]:
    """The input and output topics of one system's Kafka run, created with two partitions and an
    explicit retention: Quix reads ``retention.ms`` back with DescribeConfigs, and Tansu reports only
    the configs set explicitly on a topic."""
    from localstate.changelog.kafka.io import ensure_topic

    topics = (f"events-{name}", f"counts-{name}")
    for topic in topics:
        ensure_topic(settings, topic, 2, -1, create=True, configs={"retention.ms": "-1", "retention.bytes": "-1"})
    return topics


def _measure(system, events: Events, watcher: Watcher, rates: list[int], seconds: float, idle: float,
             burst: int = 0) -> tuple[dict, dict[int, dict], float]:
    """Start ``system``, warm it up, then each rate's latencies, the idle CPU and (``burst``) the
    sustained throughput; the system stopped at the end, whatever happened."""
    watcher.start()
    info: dict = {"warm": False}
    per_rate: dict[int, dict] = {}
    idle_pct = float("nan")
    started = time.monotonic()
    system.start()
    try:
        info["warm"] = _warm(events, watcher, system)
        info["startup_s"] = time.monotonic() - started
        if not info["warm"]:
            return info, per_rate, idle_pct
        for rate in rates:
            began = time.monotonic()
            first, end = events.run(rate, seconds)
            # What the writer managed: a Kafka producer in this process may fall short of the rate.
            written_per_s = (end - first) / (time.monotonic() - began)
            watcher.caught_up(end, 60.0)
            per_rate[rate] = {**_latency(events, watcher, first, end), "written_per_s": written_per_s}
        if idle > 0:
            time.sleep(IDLE_SETTLE)
            idle_pct = _idle_cpu(system, idle)
        if burst:
            info["throughput"] = _throughput(events, watcher, burst)
    finally:
        info["exit"] = system.stop()
        info["leftovers"] = system.leftovers
        watcher.stop.set()
        watcher.join()
        if isinstance(system, Localstate):
            info["runs"] = system.runs
    return info, per_rate, idle_pct


def _bytes(directory: Path) -> int:
    total = 0
    for f in directory.rglob("*"):
        try:
            total += f.stat().st_size if f.is_file() else 0
        except OSError:  # replaced or deleted meanwhile (an atomic checkpoint write, a compaction)
            pass
    return total


def _expected_counts(total: int, users: int) -> np.ndarray:
    return np.bincount(np.arange(total) % users, minlength=users)


def _soak(report: Report, root: Path, minutes: float, rate: int, kill_every: float, users: int, tick: float,
          standing: bool) -> bool:
    seconds = minutes * 60.0
    events = Events(root, users, int(rate * seconds * 1.1) + 200_000, False, tick)
    system = Localstate(root, standing, root / "localstate-soak.log")
    watcher = Watcher([root / "job" / "out"], events)
    watcher.start()
    system.start()
    samples: list[tuple[float, float, float, int, int, int, float, float, int]] = []
    job_state = root / "job" / "state"
    kills = 0
    probes: list[tuple[int, float]] = []
    stop = threading.Event()
    try:
        if not _warm(events, watcher, system):
            report.notes.append("soak: the job never produced output; see " + str(system.log))
            return False
        writer = threading.Thread(target=events.run, args=(rate, seconds, stop), daemon=True)
        began = time.monotonic()
        writer.start()
        next_kill = began + kill_every
        while writer.is_alive():
            time.sleep(5.0 if writer.is_alive() else 0)
            driver, workers = _roles(system.pid())
            forked = _forked_workers(system.pid())
            samples.append((time.monotonic() - began, sum(map(_rss_mb, driver)), sum(map(_rss_mb, workers)),
                            sum(map(_fds, driver)), _bytes(job_state / "standing-bench" / "checkpoints"),
                            _bytes(job_state / "changelogs"),
                            sum(_rss_mb(p) for p in driver if "java" in _cmdline(p).split(" ", 1)[0]),
                            max(map(_rss_mb, forked), default=0.0), len(forked)))
            if time.monotonic() >= next_kill:
                probes.append(_restore_probe(system.job))  # before each kill: restore cost over the run
                victim = _worker_to_kill(system.pid())
                if victim is not None:
                    os.kill(victim, signal.SIGKILL)
                    kills += 1
                next_kill += kill_every
        drained = watcher.caught_up(events.count, 120.0)
    finally:
        stop.set()
        code = system.stop()
        watcher.stop.set()
        watcher.join()
    # Exactness, with the job stopped: the store and the outputs against the events written.
    expected = _expected_counts(events.count, users)
    dump = subprocess.run(CLI + ["inspect", str(system.job), "--store", "counts", "--json", "--limit", "0"],
                          capture_output=True, text=True, timeout=600)
    state = np.zeros(users, dtype=np.int64)
    for line in dump.stdout.splitlines():
        record = json.loads(line)
        state[int(record["key"][5:])] = int(record["value"])
    outputs = np.zeros(users, dtype=np.int64)
    for p in (0, 1):
        for record in read_jsonl(root / "job" / "out", p):  # every segment, in order
            outputs[int(record["key"][5:])] = int(record["value"])
    state_ok, outputs_ok = bool(np.array_equal(state, expected)), bool(np.array_equal(outputs, expected))
    third = max(1, len(samples) // 3)
    early = max(1, (len(probes) + 2) // 3)  # the probes of the first and of the last third of the kills
    late = len(probes) - early
    first, last = samples[:third], samples[-third:]
    mean = lambda rows, i: float(np.mean([r[i] for r in rows])) if rows else float("nan")  # noqa: E731
    peak = lambda rows, i: float(max(r[i] for r in rows)) if rows else float("nan")  # noqa: E731
    growth = lambda before, after: 100.0 * (after / before - 1) if before else float("nan")  # noqa: E731
    progress = root / "job" / "state" / "standing-bench" / "progress"
    restores = []
    for path in sorted(progress.glob("progress.jsonl*")):
        for line in path.read_text().splitlines():
            p = json.loads(line)
            if p["state"]["restore"]["records"] or p["state"]["cold_tasks"]:
                restores.append((p["state"]["restore"]["records"], p["state"]["restore"]["ms"]))
    state_bytes = _bytes(job_state)
    lat = _latency(events, watcher, 0, events.count)
    # RSS over the run (MB, one sample a minute): whether growth is a warm-up that levels off or goes on.
    minute = [r for i, r in enumerate(samples) if i == 0 or int(r[0] // 60) != int(samples[i - 1][0] // 60)]
    report.notes.append("RSS by minute, Python driver / JVM / Python workers (MB; forked workers, largest "
                        "one's MB): " + ", ".join(f"{r[0] / 60:.0f}m {r[1] - r[6]:.0f}/{r[6]:.0f}/{r[2]:.0f} "
                                                   f"({r[8]}, {r[7]:.0f})" for r in minute))
    report.add("soak", minutes=minutes, events=events.count, rate=rate, worker_kills=kills,
               driver_rss_first_mb=mean(first, 1), driver_rss_last_mb=mean(last, 1),
               jvm_rss_first_mb=mean(first, 6), jvm_rss_last_mb=mean(last, 6),
               driver_rss_growth_pct=growth(mean(first, 1), mean(last, 1)),
               driver_rss_peak_first_mb=peak(first, 1), driver_rss_peak_last_mb=peak(last, 1),
               driver_rss_peak_growth_pct=growth(peak(first, 1), peak(last, 1)),
               jvm_rss_growth_pct=growth(mean(first, 6), mean(last, 6)),
               workers_rss_first_mb=mean(first, 2), workers_rss_last_mb=mean(last, 2),
               workers_rss_growth_pct=growth(mean(first, 2), mean(last, 2)),
               workers_rss_peak_first_mb=peak(first, 2), workers_rss_peak_last_mb=peak(last, 2),
               workers_rss_peak_growth_pct=growth(peak(first, 2), peak(last, 2)),
               # Per process: the sum above also moves with how many workers Spark keeps forked.
               worker_rss_max_first_mb=mean(first, 7), worker_rss_max_last_mb=mean(last, 7),
               worker_rss_max_growth_pct=growth(mean(first, 7), mean(last, 7)),
               forked_workers_min=min((r[8] for r in samples), default=0),
               forked_workers_max=max((r[8] for r in samples), default=0),
               driver_fds_first=int(mean(first, 3)), driver_fds_last=int(mean(last, 3)),
               checkpoint_bytes_first=int(mean(first, 4)), checkpoint_bytes_last=int(mean(last, 4)),
               changelog_bytes_first=int(mean(first, 5)), changelog_bytes_last=int(mean(last, 5)),
               state_dir_bytes=state_bytes, restores=len(restores),
               restore_records_first=restores[0][0] if restores else 0,
               restore_records_last=restores[-1][0] if restores else 0,
               restore_ms_first=restores[0][1] if restores else 0.0,
               restore_ms_last=restores[-1][1] if restores else 0.0,
               cold_restore_records_first=probes[0][0] if probes else 0,
               cold_restore_records_last=probes[-1][0] if probes else 0,
               cold_restore_ms_first=1000 * probes[0][1] if probes else 0.0,
               cold_restore_ms_last=1000 * probes[-1][1] if probes else 0.0,
               # A cold restore reads the live state plus the tail since the last compaction round:
               # a sawtooth of one compact_interval, so each third's worst probe is compared.
               cold_restore_ms_peak_first=1000 * max((p[1] for p in probes[:early]), default=0.0),
               cold_restore_ms_peak_last=1000 * max((p[1] for p in probes[late:]), default=0.0),
               p50_ms=lat["p50_ms"], p99_ms=lat["p99_ms"], drained=drained, exit=code,
               left_behind=system.leftovers,
               state_exact=state_ok, outputs_exact=outputs_ok)
    return state_ok and outputs_ok and drained


Measured = tuple[dict, dict[int, dict], float]
"""One system's run: (info: warm, startup_s, throughput, leftovers...; per rate's figures; idle CPU %)."""


def _latency_runs(report: Report, root: Path, args: argparse.Namespace, rates: list[int], modes: list[str],
                  inputs: list[str], seconds: float, idle: float, burst: int, standing: bool) -> bool:
    """Every system of the latency run, one after the other on the same events: localstate in each
    mode on each input, Structured Streaming on the files, Quix Streams on Kafka; then the table's rows
    and ratios. False when a localstate run failed or missed events."""
    capacity = _capacity(rates, seconds, burst)
    measured: dict[str, Measured] = {}
    ok = True
    if "jsonl" in inputs:
        for mode in modes:  # each mode on its own copy of the job, with the same events
            (root / mode).mkdir()
            _setup(root / mode, mode=mode, epoch=args.epoch)
            measured[f"localstate {mode}"] = _measure(*_file_trial("localstate", root / mode, capacity, args.users,
                                                                   args.tick, standing), rates, seconds, idle, burst)
        if not args.no_floor:
            (root / "floor").mkdir()
            _setup(root / "floor")
            events = Events(root / "floor", args.users, capacity, False, args.tick)
            measured["floor"] = _measure(Floor(root / "floor", root / "floor" / "floor.log"), events,
                                         Watcher([root / "floor" / "job" / "out"], events), rates, seconds, 0)
            (root / "reader").mkdir()
            _setup(root / "reader")
            events = OutputEvents(root / "reader", args.users, capacity, False, args.tick)
            measured["reader floor"] = _measure(Idle(), events, Watcher([root / "reader" / "job" / "out"], events),
                                                rates, seconds, 0)
        if not args.no_peer:
            measured["Structured Streaming"] = _measure(*_file_trial("spark", root, capacity, args.users, args.tick,
                                                                     True), rates, seconds, idle)
    if "kafka" in inputs:
        measured.update(_kafka_runs(report, root, args, rates, modes, seconds, idle, burst, standing, capacity))
    for name, (found, per_rate, _) in measured.items():
        if not found["warm"]:
            report.notes.append(f"{name} produced no output; see its log under the temp folder (--keep)")
        if name.startswith("localstate"):
            ok = ok and found["warm"] and all(r["missing"] == 0 for r in per_rate.values())
    _rows(report, measured, rates, burst)
    _ratios(report, measured, rates, burst)
    for name, (found, _, _) in measured.items():
        if found.get("leftovers"):
            report.notes.append(f"{name}: {found['leftovers']} process(es) of its group were still there "
                                f"{GROUP_GRACE:.0f}s after it exited (SIGKILLed)")
    startups = ", ".join(f"{name} {found.get('startup_s', float('nan')):.1f}s" for name, (found, _, _) in
                         measured.items())
    report.notes.append(f"startup (until the first output; excluded from the latencies): {startups}")
    if not standing:
        report.notes.append("bounded mode: latency includes starting a run (JVM, SparkContext) per loop; "
                            "idle CPU is the loop of runs finding nothing to do")
    return ok


def _kafka_runs(report: Report, root: Path, args: argparse.Namespace, rates: list[int], modes: list[str],
                seconds: float, idle: float, burst: int, standing: bool, capacity: int) -> dict[str, Measured]:
    """localstate in each mode reading and writing Kafka topics, then Quix Streams, on one dev broker
    (Tansu, in memory) that this function starts and stops; each system on topics of its own."""
    from localstate.changelog.kafka.client import CONNECTION_OPTIONS, client_settings
    from localstate.changelog.kafka.devbroker import DevBroker
    from localstate.changelog.kafka.io import close_clients
    from localstate.core.options import validate_options

    from bench.kv import _quix_python

    measured: dict[str, Measured] = {}
    broker = DevBroker(log_file=root / "tansu.log").start()
    try:
        servers = broker.bootstrap_servers
        settings = client_settings(validate_options(CONNECTION_OPTIONS, {"bootstrap_servers": servers}, "bench"))
        report.params["kafka"] = "Tansu dev broker (memory, loopback); outputs read with isolation_level=read_committed"
        for mode in modes:
            where = root / f"kafka-{mode}"
            events_topic, counts_topic = _kafka_topics(settings, mode)
            _setup(where, mode=mode, epoch=args.epoch,
                   io=KAFKA_IO.format(events=events_topic, counts=counts_topic, servers=servers))
            events = KafkaEvents(settings, events_topic, args.users, capacity, args.tick)
            system = Localstate(where, standing, where / "localstate.log")
            measured[f"localstate {mode}, Kafka"] = _measure(system, events, KafkaWatcher(settings, counts_topic, events),
                                                             rates, seconds, idle, burst)
        if not args.no_floor:
            events_topic, counts_topic = _kafka_topics(settings, "floor")
            (root / "kafka-floor" / "job").mkdir(parents=True)
            events = KafkaEvents(settings, events_topic, args.users, capacity, args.tick)
            system = Floor(root / "kafka-floor", root / "kafka-floor" / "floor.log", (servers, events_topic, counts_topic))
            measured["floor, Kafka"] = _measure(system, events, KafkaWatcher(settings, counts_topic, events), rates,
                                                seconds, 0)
            _, counts_topic = _kafka_topics(settings, "reader")
            events = KafkaOutputEvents(settings, counts_topic, args.users, capacity, args.tick)
            try:
                measured["reader floor, Kafka"] = _measure(Idle(), events, KafkaWatcher(settings, counts_topic, events),
                                                           rates, seconds, 0)
            finally:
                events.producer.close(timeout=1)
        python = None if args.no_peer or args.no_quix else _quix_python()
        if python is None and not (args.no_peer or args.no_quix):
            report.notes.append("Quix Streams was not measured (no Python with quixstreams; make "
                                "/tmp/localstate-peers with `pip install quixstreams`, or set PEERS_VENV)")
        if python is not None:
            events_topic, counts_topic = _kafka_topics(settings, "quix")
            (root / "quix").mkdir()
            events = KafkaEvents(settings, events_topic, args.users, capacity, args.tick)
            system = QuixPeer(root / "quix", root / "quix" / "quix.log", python, servers, events_topic, counts_topic,
                              args.quix_guarantee, args.quix_commit_interval)
            report.params["quix"] = (f"processing_guarantee={args.quix_guarantee}, "
                                     f"commit_interval={args.quix_commit_interval:g}s")
            # No burst, as for Structured Streaming: no target uses a peer's throughput, and a peer that
            # fell behind at the last rate would spend the burst's whole timeout (10 minutes) on it.
            measured[f"Quix Streams {args.quix_guarantee}, Kafka"] = _measure(
                system, events, KafkaWatcher(settings, counts_topic, events), rates, seconds, idle)
    finally:
        close_clients()  # this process's pooled producers would reconnect to the stopped broker forever
        broker.stop()
    return measured


def _rows(report: Report, measured: dict[str, Measured], rates: list[int], burst: int) -> None:
    """The table: every system's latencies per rate, then the idle CPU and sustained throughput."""
    for rate in rates:
        for name, (_, per_rate, _) in measured.items():
            if rate in per_rate:
                report.add(f"{name} {rate:,}/s", **per_rate[rate])
    for name, (found, _, idle_pct) in measured.items():
        if not name.startswith(("floor", "reader floor")):  # they poll every millisecond: no idle figure
            report.add(f"idle CPU, {name}", cpu_pct_of_core=idle_pct)
    for name, (found, _, _) in measured.items():
        if burst and "throughput" in found:
            report.add(f"sustained throughput, {name}", events_per_s=found["throughput"], burst=burst)


def _ratios(report: Report, measured: dict[str, Measured], rates: list[int], burst: int) -> None:
    """The ratios issue #46 targets, within this run: micro-batch / continuous latency (≥ 10 at
    10k/s), a peer's / continuous latency (Quix: ≥ 1 at 1k and 10k/s), continuous / micro-batch
    throughput (≥ 0.8)."""
    def ratio(label: str, slower: dict | None, faster: dict | None, q: str, target: str | None = None) -> None:
        if slower and faster and faster[f"{q}_ms"] > 0:
            report.ratio(label, slower[f"{q}_ms"] / faster[f"{q}_ms"], target)

    for rate in rates:
        at = f"at {rate:,}/s"
        for suffix in ("", ", Kafka"):
            batch = measured.get(f"localstate micro-batch{suffix}", ({}, {}, 0.0))[1].get(rate)
            cont = measured.get(f"localstate continuous{suffix}", ({}, {}, 0.0))[1].get(rate)
            for q in ("p50", "p99", "p99_9"):
                ratio(f"{q.replace('_', '.')} latency: micro-batch / continuous{suffix} {at}", batch, cont, q,
                      ">= 10" if q == "p99" and rate == 10_000 else None)
            floor = measured.get(f"floor{suffix}", ({}, {}, 0.0))[1].get(rate)
            for q in ("p50", "p99"):
                ratio(f"{q} latency: micro-batch / floor{suffix} {at}", batch, floor, q)
                ratio(f"{q} latency: continuous / floor{suffix} {at}", cont, floor, q)
        for peer, (_, theirs, _) in measured.items():
            if not peer.startswith(("localstate", "floor", "reader floor")):
                suffix = ", Kafka" if peer.endswith("Kafka") else ""
                for mode in ("micro-batch", "continuous"):
                    mine = measured.get(f"localstate {mode}{suffix}", ({}, {}, 0.0))[1].get(rate)
                    for q in ("p50", "p99"):
                        target = ">= 1" if peer.startswith("Quix") and mode == "continuous" and q == "p99" \
                            and rate in (1_000, 10_000) else None
                        ratio(f"{q} latency: {peer.rsplit(',', 1)[0]} / localstate {mode}{suffix} {at}",
                              theirs.get(rate), mine, q, target)
    if burst:
        for suffix in ("", ", Kafka"):
            batch = measured.get(f"localstate micro-batch{suffix}", ({}, {}, 0.0))[0].get("throughput")
            cont = measured.get(f"localstate continuous{suffix}", ({}, {}, 0.0))[0].get("throughput")
            if batch and cont:
                report.ratio(f"sustained throughput: continuous / micro-batch{suffix}", cont / batch, ">= 0.8")


def _exit_on_signal(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench standing")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--quick", action="store_true", help="short windows (6 s per rate, 5 s idle)")
    parser.add_argument("--rates", default="1000,10000,50000", help="events/s, comma-separated")
    parser.add_argument("--seconds", type=float, default=None, help="seconds per rate (default 30; --quick 6)")
    parser.add_argument("--idle-seconds", type=float, default=None, help="idle CPU window (default 30; --quick 5)")
    parser.add_argument("--users", type=int, default=1000)
    parser.add_argument("--tick", type=float, default=0.1, help="seconds between appends (one file each for Spark)")
    parser.add_argument("--no-peer", action="store_true", help="skip the peers (Structured Streaming and Quix Streams)")
    parser.add_argument("--inputs", default="jsonl,kafka",
                        help="inputs to measure, comma-separated: jsonl (JSON-lines files; Structured Streaming's "
                             "peer) and kafka (topics on a dev broker; Quix Streams' peer)")
    parser.add_argument("--no-quix", action="store_true", help="skip the Quix Streams peer (Kafka)")
    parser.add_argument("--no-floor", action="store_true",
                        help="skip the floor rows (bench/standing_floor.py: the same reads and durable commit "
                             "steps without Spark, a store or a task)")
    parser.add_argument("--quix-guarantee", default="exactly-once", choices=("exactly-once", "at-least-once"),
                        help="Quix Streams' processing_guarantee")
    parser.add_argument("--quix-commit-interval", type=float, default=0.1,
                        help="Quix Streams' commit_interval, seconds (its default is 5; 0.1 is Kafka Streams' "
                             "default under exactly-once)")
    parser.add_argument("--minutes", type=float, nargs="?", const=30.0, default=None,
                        help="soak mode: N minutes (default 30) at --rate with worker kills")
    parser.add_argument("--rate", type=int, default=10_000, help="soak: events/s")
    parser.add_argument("--kill-every", type=float, default=None,
                        help="soak: seconds between worker SIGKILLs (default: a sixth of the run, 5 min of 30)")
    parser.add_argument("--compact-every", type=float, default=None,
                        help="soak: the file changelog's compact_interval, seconds (default: a third of the run, "
                             "10 min of 30, its default)")
    parser.add_argument("--modes", default="micro-batch,continuous",
                        help="localstate's [spark] modes to measure, comma-separated")
    parser.add_argument("--epoch", type=float, default=None,
                        help="continuous mode: [spark] epoch in seconds (default: the job's default, 5 minutes)")
    parser.add_argument("--burst", type=int, default=None,
                        help="events appended at once after the rates, for the sustained throughput (default 300000; "
                             "--quick 100000; 0: skip)")
    parser.add_argument("--keep", action="store_true", help="keep the temp folder (its path is printed)")
    args = parser.parse_args(argv)
    # A SIGTERM or SIGHUP of the bench stops its processes in order (the finally blocks) before it exits.
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _exit_on_signal)
    rates = [int(r) for r in args.rates.split(",") if r]
    modes = [m for m in args.modes.split(",") if m]
    inputs = [i for i in args.inputs.split(",") if i]
    if set(inputs) - {"jsonl", "kafka"}:
        parser.error(f"--inputs: jsonl, kafka (got {args.inputs})")
    burst = args.burst if args.burst is not None else (100_000 if args.quick else 300_000)
    seconds = args.seconds if args.seconds is not None else (6.0 if args.quick else 30.0)
    idle = args.idle_seconds if args.idle_seconds is not None else (5.0 if args.quick else 30.0)
    standing = standing_supported()
    mode = "standing (one localstate run process)" if standing else \
        "bounded runs looped (localstate run has no --until-drained here: every run starts a JVM)"
    tmp = tempfile.mkdtemp(prefix="bench-standing-")
    root = Path(tmp)
    try:
        ok = True
        if args.minutes is not None:
            if args.kill_every is None:
                args.kill_every = args.minutes * 60.0 / 6
            if args.compact_every is None:
                args.compact_every = args.minutes * 60.0 / 3
            soak_mode = modes[0] if len(modes) == 1 else "micro-batch"  # --modes continuous: soak that mode
            report = Report("standing soak", {"master": "local[2]", "partitions": 2, "mode": mode,
                                              "spark_mode": soak_mode,
                                              "minutes": args.minutes, "rate": args.rate,
                                              "kill_every_s": args.kill_every, "compact_every_s": args.compact_every})
            _setup(root, args.compact_every, mode=soak_mode, epoch=args.epoch)
            ok = _soak(report, root, args.minutes, args.rate, args.kill_every, args.users, args.tick, standing)
        else:
            report = Report("standing", {"master": "local[2]", "partitions": 2, "mode": mode,
                                         "seconds_per_rate": seconds, "tick_s": args.tick, "users": args.users,
                                         "idle_s": idle, "inputs": ",".join(inputs),
                                         "load_average_start": round(os.getloadavg()[0], 2)})
            ok = _latency_runs(report, root, args, rates, modes, inputs, seconds, idle, burst, standing)
    finally:
        if not args.keep:  # also when the bench is stopped by a signal
            import shutil

            shutil.rmtree(root, ignore_errors=True)
    if args.keep:
        report.notes.append(f"kept {root}")
    report.emit_with_load_average(args.json)
    return 0 if ok else 1
