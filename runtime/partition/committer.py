"""When a task partition commits, and how each commit's checkpoint gets saved.

*When* is a :class:`CommitPolicy`: :class:`ConfiguredCommits` (the in-process runtime, the
TaskTestDriver, a continuous run: every ``commit_every`` records, else every ``commit_interval``
seconds, and whenever the task asks) or :class:`BatchCommits` (a micro-batch: nothing commits inside
the batch; its runtime prepares one commit at the batch's end and the driver saves it).

*How* is the :class:`Committer`. In line, a commit's checkpoint is saved before the commit returns.
Pipelined (when every logged store's changelog only *starts* its write at flush: the objectstore's
delta PUT, :class:`~localstate.core.changelog.DeferredDurability`), the commit hands checkpoint N,
naming the objects in flight, to a committer thread that saves it once every object it names is
durable. At most :data:`PIPELINE_DEPTH` commits are in flight (a commit beyond that first waits for
the oldest save); saves run in order on that one thread, fenced by generation as always, and a save
that a newer commit already follows is skipped (the newer checkpoint covers it). A crash with commit
N pending is a crash between a flush and its checkpoint: recovery rolls the stores back to
checkpoint N-1. A failed write surfaces, typed, at the next commit or close, and checkpoint N is
never saved.
"""

from __future__ import annotations

import concurrent.futures
import logging
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable, Protocol

from localstate.core.checkpoint import Checkpoint, CheckpointStore
from localstate.runtime.partition.accounting import Began, CommitAccounting
from localstate.runtime.partition.faults import crash_point

__all__ = ["CommitPolicy", "ConfiguredCommits", "BatchCommits", "Committer", "PIPELINE_DEPTH", "CHECK_EVERY"]

log = logging.getLogger(__name__)

PIPELINE_DEPTH = 2
"""Pipelined commits in flight at most: one being saved and one waiting behind it, so a commit does
not wait when one save (a PUT plus the checkpoint's requests, each needing the GIL back from the
busy task thread) takes a little longer than a batch."""


CHECK_EVERY = 16
"""Records between two looks at a time-based commit policy inside a feed: the clock is read once per
that many records, not per record, so a commit due by time comes at most that many records late."""


class CommitPolicy(Protocol):
    """Whether a commit is due between two calls into the task."""

    def due(self, processed: int, elapsed: float, requested: bool) -> bool:
        """``processed`` records since the last commit, ``elapsed`` seconds since it, ``requested``:
        the task asked (``coordinator.commit()``)."""
        ...

    def records_until_due(self, processed: int) -> int:
        """Records (at least 1) that may be processed, after ``processed`` since the last commit,
        before :meth:`due` needs asking again (a request by the task aside)."""
        ...


@dataclass(frozen=True)
class ConfiguredCommits:
    """Every ``every`` records if set, else every ``interval`` seconds; and whenever the task asks."""

    interval: float
    every: int | None = None

    def due(self, processed: int, elapsed: float, requested: bool) -> bool:
        if requested:
            return True
        return processed >= self.every if self.every is not None else elapsed >= self.interval

    def records_until_due(self, processed: int) -> int:
        return max(1, self.every - processed) if self.every is not None else CHECK_EVERY


class BatchCommits:
    """A micro-batch decides: nothing commits between two calls into the task (the batch's runtime
    prepares one commit at the batch's end, and the driver saves it with the other partitions')."""

    def due(self, processed: int, elapsed: float, requested: bool) -> bool:
        return False

    def records_until_due(self, processed: int) -> int:
        return CHECK_EVERY


class Committer:
    """Counts what a partition did since its last commit, says when the next one is due, and saves
    checkpoints (in line, or pipelined on one thread). Not thread safe: the partition's driving
    thread calls it; only the saves run on the committer thread."""

    def __init__(self, checkpoints: CheckpointStore, partition: int, policy: CommitPolicy,
                 clock: Callable[[], float]) -> None:
        self.checkpoints = checkpoints
        self.partition = partition
        self.policy = policy
        self.clock = clock
        self.processed = 0
        """records processed since the last commit"""
        self.commits = 0
        self.last_commit = clock()
        self.commit_wait_seconds = 0.0
        """time :meth:`settle` waited for a pipelined commit's save (what pipelining did not hide)"""
        self.checkpoint_seconds = 0.0
        """time spent saving checkpoints, on whichever thread saved them (the committer's, pipelined)"""
        self.accounting = CommitAccounting()
        """each commit's duration and its oldest record's wait (:mod:`.accounting`), for the checkpoints"""
        self._began: Began | None = None  # the commit in progress, from prepare() or make_room() to its end
        # pipelined commits' checkpoint saves, oldest first; each returns its commit's start and end
        self._saves: deque[Future[tuple[Began, float] | None]] = deque()
        self._submitted = 0  # pipelined commits submitted so far (a save knows whether a newer one follows)
        self._executor: ThreadPoolExecutor | None = None

    def due(self, requested: bool) -> bool:
        """Whether the policy wants a commit now (``requested``: the task asked for one)."""
        return self.policy.due(self.processed, self.clock() - self.last_commit, requested)

    def records_until_due(self) -> int:
        """Records that may be processed before :meth:`due` needs asking again (a task's request aside)."""
        return self.policy.records_until_due(self.processed)

    def counted(self) -> None:
        """A commit was made: the commit triggers start over. Saved in line, it ended: it is counted
        (:attr:`accounting`); pipelined, it is once its save ended."""
        self.processed = 0
        self.commits += 1
        self.last_commit = self.clock()
        if self._began is not None:
            self.accounting.end(self._began)
            self._began = None

    def prepare(self) -> None:
        """A commit saved in line starts (or a micro-batch's, which the driver saves and this does not
        count): wait for the pipelined saves in flight, as :meth:`settle`."""
        self._began = self.accounting.begin()
        self.settle()

    # -- saving checkpoints ----------------------------------------------------------------------
    def save(self, checkpoint: Checkpoint, generation: int) -> None:
        """Save ``checkpoint`` atomically, fenced by ``generation`` (crash point ``after_checkpoint``)."""
        started = time.perf_counter()
        self.checkpoints.save(checkpoint, expect_generation=generation)
        self.checkpoint_seconds += time.perf_counter() - started
        crash_point("after_checkpoint")

    def submit(self, checkpoint: Checkpoint, waits: list[Callable[[], None]], generation: int) -> None:
        """Pipelined: save ``checkpoint`` on the committer thread once every wait in ``waits`` returned
        (its objects are durable). Call :meth:`make_room` before preparing the commit."""
        if self._executor is None:
            self._executor = ThreadPoolExecutor(1, thread_name_prefix=f"localstate-commit-{self.partition}")
        self._submitted += 1
        began, self._began = self._began, None
        self._saves.append(self._executor.submit(self._save_when_durable, checkpoint, waits, generation,
                                                 self._submitted, began))

    def make_room(self) -> None:
        """A pipelined commit starts: wait for the oldest save while :data:`PIPELINE_DEPTH` are in flight."""
        self._began = self.accounting.begin()
        self._settle(keep=PIPELINE_DEPTH - 1)

    def wait_all(self) -> None:
        """Let every save in flight end, without raising (a failed flush is on its way up)."""
        concurrent.futures.wait(self._saves)

    def settle(self) -> None:
        """Wait until every save in flight is done (or superseded). Raises the first failure typed (a
        write it names failed: ChangelogError; its checkpoint could not be saved: CheckpointError,
        FencedError): the last saved checkpoint stays the committed one."""
        self._settle(keep=0)

    @property
    def in_flight(self) -> int:
        """Saves still running or queued (at most :data:`PIPELINE_DEPTH`)."""
        return sum(not save.done() for save in self._saves)

    def _settle(self, keep: int) -> None:
        saves = self._saves
        while saves and (saves[0].done() or len(saves) > keep):
            waited = time.perf_counter()
            try:
                done = saves[0].result()
                if done is not None:
                    self.accounting.end(*done)
            finally:
                self.commit_wait_seconds += time.perf_counter() - waited
                saves.popleft()

    def _save_when_durable(self, checkpoint: Checkpoint, waits: list[Callable[[], None]], generation: int,
                           number: int, began: Began | None) -> tuple[Began, float] | None:
        """Committer thread: wait until every object ``checkpoint`` names is durable, then save it,
        unless a newer commit was submitted meanwhile: its checkpoint, saved next on this thread,
        covers everything this one does (checkpoints are cumulative), so this save is skipped. That
        keeps the saves from falling behind when one takes longer than a batch. Returns ``(began,
        ended)`` of the commit for its accounting (None: ``began`` was)."""
        for durable in waits:
            durable()
        crash_point("commit_pending")  # every commit's save reaches it, skipped or not (tests count them)
        if number >= self._submitted:
            self.save(checkpoint, generation)
        return None if began is None else (began, self.accounting.clock())

    def drop(self) -> None:
        """Let the saves in flight finish (logged if not saved) and stop the committer thread."""
        saves, self._saves = list(self._saves), deque()
        concurrent.futures.wait(saves)
        for save in saves:
            if save.exception() is not None:
                log.warning("task partition %d: a commit in flight was not saved (%s); the last saved "
                            "checkpoint stays the committed one", self.partition, save.exception())
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None
