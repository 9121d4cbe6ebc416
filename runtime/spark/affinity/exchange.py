"""Row exchange between the apply tasks of one DataFrame batch: rows go to the worker whose
partition is still open.

After the batch's shuffle, Spark task ``s`` holds the rows of job partition ``s``, but which Python
worker runs it is Spark's choice (its idle-worker queue). A worker that kept partition ``k`` open
since the last batch (:mod:`.instances`) and now gets the rows of ``p != k`` would close ``k`` and
reopen ``p`` with a cold cache, while the worker that kept ``p`` does the same the other way round.
The tasks of a batch exchange rows instead, through files in the batch's exchange directory (on the
state directory's file system, like the partition locks; removed by the driver after the batch):

1. At its start (before its rows arrive) each task writes its *intent*: ``keep`` (its worker keeps
   nothing, or the task's own partition) or ``offer`` (its worker keeps another partition).
2. A task that offers writes its rows to ``rows-<p>.arrow`` (written aside, then renamed: a reader
   sees all of them or nothing), then claims the partition its worker keeps if that partition's rows
   are offered (waiting for them only while their task has said ``offer`` and is still writing them,
   :data:`WAIT`), else its own, else any offered partition nobody claimed; then it says ``decided``.
3. When done with that, it claims its own partition if nobody took it (after every task that offers
   has decided, so that a keeper about to take the rows gets them), and applies it too.

A claim is a file per partition holding the claiming task's slot, created atomically
(:func:`~.instances.try_claim`), so each partition is applied by exactly one task; a partition
whose rows were never written to a file can only be claimed by its own task. A retried task attempt
(its Python worker died) applies what its slot claimed before, reading rows it does not hold from
their files. Nothing waits unboundedly: a task whose offered partition is not claimed applies it
itself, and the wait for a partner's rows is bounded. Exactly once is not this module's business:
each partition's checkpoint (batch id, generation fencing) still decides whether a batch is applied.
"""

from __future__ import annotations

import os
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Mapping

import pyarrow as pa

from localstate.core.fsutil import os_error, read_nofollow, write_atomic
from localstate.runtime.spark.affinity.kept import claimed_by, try_claim
from localstate.errors import CheckpointIOError

__all__ = ["RowExchange", "WAIT"]

WAIT = 2.0
"""Seconds a task waits for the rows of the partition its worker keeps, once that partition's task
said it offers them (it is receiving its own rows from the shuffle; normally milliseconds)."""
_POLL = 0.001


class RowExchange:
    """One apply task's side of a batch's row exchange (directory ``directory``, Spark task ``slot``)."""

    def __init__(self, directory: Path, slot: int) -> None:
        self.directory = Path(directory)
        self.slot = slot
        self.claims = self.directory / "claims"

    # -- files ------------------------------------------------------------------------------------
    def _rows_path(self, partition: int) -> Path:
        return self.directory / f"rows-{int(partition)}.arrow"

    def _intent_path(self, slot: int) -> Path:
        return self.directory / f"intent-{int(slot)}"

    def _write(self, path: Path, data: bytes) -> None:
        """``data`` at ``path``, renamed into place, not fsynced: the files live for one batch
        execution, and a crash makes Spark execute the batch again under a new directory."""
        write_atomic(path, data, error=CheckpointIOError, durable=False)

    def _decided_path(self, slot: int) -> Path:
        return self.directory / f"decided-{int(slot)}"

    def _undecided_offers(self) -> bool:
        """Whether another task said it offers its rows and has not made its first claim yet (it may
        still claim the rows this task offered)."""
        for entry in os.listdir(self.directory):
            if entry.startswith("intent-") and entry[7:].isdigit() and int(entry[7:]) != self.slot:
                slot = int(entry[7:])
                if self._intent(slot) == "offer" and not self._decided_path(slot).exists():
                    return True
        return False

    def _intent(self, slot: int) -> str | None:
        try:
            return read_nofollow(self._intent_path(slot)).decode()
        except FileNotFoundError:
            return None

    def _offered(self, partition: int) -> bool:
        return self._rows_path(partition).exists()

    def _read_rows(self, partition: int) -> Any:
        return pa.ipc.open_file(pa.py_buffer(read_nofollow(self._rows_path(partition)))).read_all()

    def _offer(self, partition: int, rows: Any) -> None:
        sink = pa.BufferOutputStream()
        with pa.ipc.new_file(sink, rows.schema) as writer:
            writer.write_table(rows)
        self._write(self._rows_path(partition), sink.getvalue().to_pybytes())

    @contextmanager
    def _typed(self) -> Iterator[None]:
        """An OS error (read-only or full state directory) as CheckpointIOError naming the directory."""
        try:
            yield
        except OSError as exc:
            raise os_error(exc, "exchange a batch's rows in", self.directory, CheckpointIOError,
                           slot=self.slot) from exc

    # -- protocol ---------------------------------------------------------------------------------
    def announce(self, own: int, kept: int | None) -> bool:
        """Step 1, at the task's start: whether this task will offer its rows (``kept`` is the
        partition its worker keeps open, ``own`` the job partition of its Spark partition)."""
        offer = kept is not None and kept != own
        with self._typed():
            self._write(self._intent_path(self.slot), b"offer" if offer else b"keep")
        return offer

    def withdraw(self) -> None:
        """Say ``keep`` after all (the task got no rows, or not the partition it expected), so that no
        other task waits for its rows."""
        with self._typed():
            self._write(self._intent_path(self.slot), b"keep")

    def assignments(self, own: Mapping[int, Any], kept: int | None, offer: bool) -> Iterator[tuple[int, Any]]:
        """The ``(partition, rows)`` this task applies, in order. ``own``: the rows of the job
        partitions in this Spark partition (with routes, exactly one: the slot's); ``offer``: what
        :meth:`announce` returned. File-system errors are CheckpointIOError naming the directory."""
        with self._typed():
            yield from self._assignments(own, kept, offer)

    def _assignments(self, own: Mapping[int, Any], kept: int | None, offer: bool) -> Iterator[tuple[int, Any]]:
        if offer and (len(own) != 1 or kept is None or kept in own):
            self.withdraw()
            offer = False
        before = claimed_by(self.claims, self.slot)
        if before:  # a retried attempt: apply what the slot claimed before
            for partition in before:
                yield partition, own[partition] if partition in own else self._read_rows(partition)
            for partition in own:
                if partition not in before and try_claim(self.claims, partition, self.slot):
                    yield partition, own[partition]
            return
        if not offer or kept is None:
            for partition, rows in own.items():
                if try_claim(self.claims, partition, self.slot):  # nobody else can: its rows are in no file
                    yield partition, rows
            return
        (mine, rows), = own.items()
        self._offer(mine, rows)
        first = self._main_claim(mine, kept)
        self._write(self._decided_path(self.slot), b"")
        if first is not None:
            yield first, rows if first == mine else self._read_rows(first)
        if first != mine:
            # The offered rows go to their keeper if it is about to claim them; if nobody takes them,
            # this task applies them itself.
            deadline = time.monotonic() + WAIT
            while self._undecided_offers() and time.monotonic() < deadline:
                time.sleep(_POLL)
            if try_claim(self.claims, mine, self.slot):
                yield mine, rows

    def _main_claim(self, mine: int, kept: int) -> int | None:
        """The partition this task applies first: ``kept`` if its rows come, else its own, else any
        offered partition nobody claimed (None: every partition it could take is taken)."""
        deadline = time.monotonic() + WAIT
        # The rows of partition ``kept`` come from Spark task ``kept`` (routes map p to p).
        while not self._offered(kept) and self._intent(kept) == "offer" and time.monotonic() < deadline:
            time.sleep(_POLL)
        if self._offered(kept) and try_claim(self.claims, kept, self.slot):
            return kept
        if try_claim(self.claims, mine, self.slot):
            return mine
        for entry in sorted(os.listdir(self.directory)):
            if entry.startswith("rows-") and entry.endswith(".arrow"):
                partition = int(entry[5:-6])
                if try_claim(self.claims, partition, self.slot):
                    return partition
        return None
