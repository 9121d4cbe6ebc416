"""The pipe to a compactor subprocess (:mod:`.compactor`): the wire format and the writer's handle.

A writer (:class:`~.partition.ObjectStoreChangelogPartition`) starts one child per partition the first
time it snapshots (``python -m localstate.changelog.objectstore.compactor``, plain
``subprocess.Popen`` with stdin/stdout pipes: no multiprocessing, whose fork/spawn misbehave inside
PySpark's Python workers). The parent sends each flushed delta's record body as it is written and a
"snapshot now" request naming the chain; the child merges the deltas into its
:class:`~.compaction.SnapshotBuilder` as they come, and on a request builds the snapshot, writes it
to the store (durable before it answers) and answers with the object's name, size and record count.
The hot path only hands bytes to a pipe from a feeder thread (a blocking write releases the GIL).

The wire protocol is length-prefixed frames of raw bytes (nothing is pickled): parent to child
``op u8, length u64, payload``; child to parent ``length u64, JSON``. The first frame carries the
store's options (credentials included, so they never appear on a command line) as JSON.

Failure model: the child's death or a pipe error mean "no snapshot this time": the parent logs a
warning and goes on with in-process snapshots (the deltas stay in the chain until then); a snapshot
the child could not write (a storage failure) is retried by the next one, as in-process. The child exits when its stdin reaches EOF (the parent closed it or died) and, should an
inherited copy of the pipe keep it open, when its parent process is gone (polled); the parent kills
it at close().
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import struct
import subprocess
import sys
from typing import Any, Mapping

from localstate.errors import ChangelogError

from .chain import ChainObject

__all__ = ["CompactorProcess", "FRAME", "REPLY", "DELTA_HEAD", "OP_INIT", "OP_ADOPT", "OP_DELTA", "OP_SNAPSHOT",
           "object_json", "object_from_json"]

log = logging.getLogger(__name__)

#: Parent-to-child frame: operation, payload length.
FRAME = struct.Struct("<cQ")
#: Child-to-parent frame: payload (JSON) length.
REPLY = struct.Struct("<Q")
#: A delta's payload starts with its chain epoch, first offset and end offset; its body follows.
DELTA_HEAD = struct.Struct("<QQQ")
OP_INIT, OP_ADOPT, OP_DELTA, OP_SNAPSHOT = b"I", b"A", b"D", b"S"
#: The pipe's capacity asked for (Linux only: F_SETPIPE_SZ), room for a commit-sized delta.
PIPE_BYTES = 1 << 20


def object_json(item: ChainObject) -> dict[str, Any]:
    return {"name": item.name, "kind": item.kind, "start": item.start, "end": item.end, "records": item.records,
            "size": item.size, "writer": item.writer}


def object_from_json(raw: Mapping[str, Any]) -> ChainObject:
    return ChainObject(raw["name"], raw["kind"], raw["start"], raw["end"], raw["records"], raw["size"], raw["writer"])


class CompactorProcess:
    """The parent's handle on one compactor child. Calls must come from one thread at a time (the
    partition's feeder thread); any failure raises ChangelogError and leaves the handle dead."""

    def __init__(self, store_spec: Mapping[str, Any], stream: str, partition: int, writer: str) -> None:
        self.stream = stream
        self.partition = partition
        self.cpu_seconds = 0.0  # the child's user + system CPU time, known once it has been reaped
        self._process: subprocess.Popen[bytes] | None = subprocess.Popen(
            [sys.executable, "-m", "localstate.changelog.objectstore.compactor"], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, close_fds=True)
        self.pid = self._process.pid
        if self._process.stdin is not None and hasattr(fcntl, "F_SETPIPE_SZ"):
            try:  # room for a whole commit's delta: the feeder's write returns without waiting for the child
                fcntl.fcntl(self._process.stdin.fileno(), fcntl.F_SETPIPE_SZ, PIPE_BYTES)
            except OSError:
                pass  # the system's limit (/proc/sys/fs/pipe-max-size) is lower: only more wake-ups
        self._send(OP_INIT, json.dumps({"store": dict(store_spec), "stream": stream, "partition": partition,
                                        "writer": writer}).encode())

    @property
    def alive(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def _error(self, what: str, exc: BaseException | None = None) -> ChangelogError:
        detail = f": {type(exc).__name__}: {exc}" if exc is not None else ""
        self.close()
        return ChangelogError(f"the compactor subprocess (pid {self.pid}) {what}{detail}", stream=self.stream,
                              partition=self.partition,
                              hint="snapshots are taken in-process from now on; nothing is lost (the deltas stay in "
                                   "the chain). Check the worker's stderr for the child's error")

    def _send(self, op: bytes, *parts: bytes | memoryview) -> None:
        process = self._process
        if process is None or process.stdin is None:
            raise self._error("is not running")
        try:
            process.stdin.write(FRAME.pack(op, sum(len(part) for part in parts)))
            for part in parts:
                process.stdin.write(part)
            process.stdin.flush()
        except (OSError, ValueError) as exc:  # BrokenPipeError: the child died
            raise self._error("cannot be written to", exc) from exc

    def adopt(self, epoch: int, fresh: bool) -> None:
        """The writer adopted a new chain (``fresh``: an empty one)."""
        self._send(OP_ADOPT, json.dumps({"epoch": epoch, "fresh": fresh}).encode())

    def feed(self, epoch: int, delta: ChainObject, body: bytes) -> None:
        """One flushed delta of chain ``epoch``, in offset order."""
        self._send(OP_DELTA, DELTA_HEAD.pack(epoch, delta.start, delta.end), body)

    def snapshot(self, objects: list[ChainObject], epoch: int) -> ChainObject:
        """Have the child compact ``objects`` and write the snapshot; its object, once durable."""
        self._send(OP_SNAPSHOT, json.dumps({"epoch": epoch, "objects": [object_json(o) for o in objects]}).encode())
        process = self._process
        assert process is not None and process.stdout is not None
        try:
            head = process.stdout.read(REPLY.size)
            if len(head) != REPLY.size:
                raise self._error("exited before answering a snapshot request")
            (length,) = REPLY.unpack(head)
            reply = json.loads(process.stdout.read(length))
        except (OSError, ValueError) as exc:
            raise self._error("answered a snapshot request unreadably", exc) from exc
        if not reply.get("ok"):
            raise ChangelogError(f"the compactor subprocess could not write a snapshot: {reply.get('error')}",
                                 stream=self.stream, partition=self.partition, path=reply.get("path"),
                                 hint="check that the storage is reachable; a later snapshot retries")
        return object_from_json(reply["snapshot"])

    def close(self) -> None:
        """Kill the child (a snapshot in flight is of no use any more) and reap it: :attr:`cpu_seconds`."""
        process, self._process = self._process, None
        if process is None:
            return
        if process.poll() is None:
            process.kill()  # first: a thread blocked reading its answer then sees EOF (close would wait for it)
        for stream in (process.stdin, process.stdout):
            try:
                if stream is not None:
                    stream.close()
            except OSError:
                pass  # a broken pipe to a dead child
        try:
            _pid, status, usage = os.wait4(process.pid, 0)
            process.returncode = os.waitstatus_to_exitcode(status)
            self.cpu_seconds = usage.ru_utime + usage.ru_stime
        except ChildProcessError:  # already reaped by poll()
            process.wait()
