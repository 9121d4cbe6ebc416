"""The accounting of a task partition's own commits: :class:`CommitAccounting` measures each commit
and the wait of its oldest record, and keeps the cumulative figures
(:class:`~localstate.core.commit_stats.CommitStats`) that every checkpoint carries to the driver.

Costs nothing per record: the feed loop already reads the clock once per chunk of records it pulls
from the inputs (:func:`~.feeder._timed_chunks`); it hands that reading over when the chunk holds the
first record since the last commit (:attr:`CommitAccounting.oldest`). A commit reads the clock at
its start and end.
"""

from __future__ import annotations

import time
from typing import Callable

from localstate.core.commit_stats import COUNT_LIMIT, CommitStats, Histogram

__all__ = ["CommitAccounting", "Began"]

Began = tuple[float, "float | None"]
"""A commit in progress: when it started, and when its oldest record was read (None: it carries no
input record), on :attr:`CommitAccounting.clock`."""


class CommitAccounting:
    """One partition's commit figures. The driving thread calls :meth:`begin` and :meth:`end`; the
    feed loop sets :attr:`oldest`. Not thread safe (a pipelined save's end is handed back to the
    driving thread, see :class:`~.committer.Committer`)."""

    clock: Callable[[], float] = staticmethod(time.perf_counter)  # the feed loop's chunk clock

    def __init__(self) -> None:
        self.oldest: float | None = None
        """when the oldest record not committed yet was read (:attr:`clock`), None if none was"""
        self.stats = CommitStats()
        self.counting = False
        """whether :attr:`stats` hold anything (a commit was counted)"""

    def opened(self, generation: int) -> None:
        """An open, which took ``generation``: the figures start over, named by it (the driver tells
        one open's figures from another's by it, see :meth:`CommitStats.since_last`)."""
        self.stats = CommitStats(since=generation)
        self.counting = False
        self.oldest = None

    def begin(self) -> Began:
        """A commit starts: what :meth:`end` needs; the records read from now on belong to the next one."""
        began, self.oldest = (self.clock(), self.oldest), None
        return began

    def end(self, began: Began, ended: float | None = None) -> None:
        """The commit ``began`` ended (at ``ended``, default now): count it."""
        ended = self.clock() if ended is None else ended
        started, oldest = began
        stats = self.stats
        commit = stats.commit.observe(max(0.0, ended - started) * 1000.0)
        latency = stats.latency if oldest is None else stats.latency.observe(max(0.0, ended - oldest) * 1000.0)
        if max(commit.counts) >= COUNT_LIMIT or commit.sum_ms >= COUNT_LIMIT or latency.sum_ms >= COUNT_LIMIT:
            commit, latency = Histogram(), Histogram()  # never reached in practice: the figures start over
        self.stats = CommitStats(stats.since, commit, latency)
        self.counting = True

    def snapshot(self) -> CommitStats | None:
        """The figures a checkpoint carries (None while there are none: such checkpoints stay as
        they were before these figures existed)."""
        return self.stats if self.counting else None
