"""A partition that follows its inputs: the record-at-a-time loop of a continuous run.

:class:`FollowingPartition` drives one open :class:`~.instance.TaskInstance` from what its inputs
hold past the instance's positions, in rounds (:meth:`FollowingPartition.step`). Each round:

1. reads every input up to its end *now* (at most :data:`ROUND_RECORDS` records a round, so a
   backlog cannot starve the timers or the commits), through the one reader (:mod:`.reading`) and
   the one feed loop (:mod:`.feeder`), committing inside the feed when the commit policy says so
   (``commit_interval`` / ``commit_every``: how often a busy partition commits);
2. fires the timers that are due (processing time by the clock, event time by the watermark), with
   no later record needed;
3. runs ``window()``: before each commit when ``window_interval`` is 0, else when its interval passed;
4. commits as soon as the partition has caught up with its inputs and has anything uncommitted, so a
   record's output is visible one poll and one commit after it was appended.

Exactly once is the instance's commit (state, changelog offsets, input positions and outputs in one
checkpoint, fenced by generation): a round adds nothing to it. A crash anywhere rolls the partition
back to its last commit, and the next open goes on from there.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Mapping

from localstate.core.stream import InputStream, follow_end
from localstate.runtime.partition.reading import read_inputs

if TYPE_CHECKING:
    from localstate.runtime.partition.instance import TaskInstance

__all__ = ["FollowingPartition", "ROUND_RECORDS"]

ROUND_RECORDS = 20_000
"""Records one round reads at most (all inputs together): bounded memory and a bounded wait for the
timers, ``window()`` and the caught-up commit of a partition that is far behind."""


class FollowingPartition:
    """One open partition of a continuous run, fed from ``inputs`` as they grow. Not thread safe:
    one loop drives it (:meth:`step`, then :meth:`finish`)."""

    def __init__(self, instance: "TaskInstance", inputs: Mapping[str, InputStream],
                 round_records: int = ROUND_RECORDS) -> None:
        self.instance = instance
        self.inputs = dict(inputs)
        self.round_records = round_records
        self.records = 0
        """records fed so far"""
        self.commits = 0
        """commits this loop made (the feed's own commits under load not included)"""
        self.caught_up = False
        """the last round read everything its inputs held"""
        self._dirty = False  # state, timers or outputs changed since the last commit

    @property
    def partition(self) -> int:
        return self.instance.partition

    def lag(self) -> int:
        """Records the inputs hold past the instance's positions, now."""
        return sum(max(0, source.end_offset(self.partition) - self.instance.position(name))
                   for name, source in self.inputs.items())

    def step(self, probe: bool = True) -> int:
        """One round (see the module docstring); returns the records it fed. ``probe=False``: the
        caller knows nothing was appended since the last round (a wait on the inputs timed out), so
        the round skips reading and only fires timers, runs ``window()`` and commits as due."""
        instance = self.instance
        if not probe:
            self._after_feed(0)
            return 0
        # A followed input (Kafka) gives its end from its own fetches, with no end probe (a request each).
        ends = {name: follow_end(source, self.partition, instance.position(name))
                for name, source in self.inputs.items()}
        behind = {name: end for name, end in ends.items() if end > instance.position(name)}
        fed = 0
        if behind:
            waiting = sum(end - instance.position(name) for name, end in behind.items())
            self.caught_up = waiting <= self.round_records
            limit = None
            if not self.caught_up:
                # Each input's read ends where the round can end, so one input's reader runs its
                # range to the end (a batch task keeps its columnar read); several inputs still
                # share one round's worth of records, in their merged order, and a read the limit
                # cuts short remembers where the next round resumes (streams/jsonl.py).
                behind = {name: min(end, instance.position(name) + self.round_records) for name, end in behind.items()}
                limit = self.round_records if len(behind) > 1 else None
            stats = instance.feed(read_inputs(instance, self.partition, behind, self.inputs, limit), self.inputs,
                                  autocommit=True)
            fed = stats.records + stats.skipped + stats.dead_lettered
        else:
            self.caught_up = True
        self.records += fed
        self._after_feed(fed)
        return fed

    def _after_feed(self, fed: int) -> None:
        """Steps 2 to 4 of a round (timers, ``window()``, the caught-up commit)."""
        instance = self.instance
        fired = instance.fire_timers()
        self._dirty = self._dirty or fed > 0 or fired > 0 or instance.committer.processed > 0
        if instance.job.window_interval and instance.maybe_window():
            self._dirty = True
        if self._dirty and (self.caught_up or instance.committer.due(instance.coordinator.commit_requested)):
            self.commit()

    def commit(self) -> None:
        """``window()`` first when it runs at every commit (``window_interval = 0``), then the commit."""
        instance = self.instance
        made = instance.committer.commits
        if instance.job.window_interval == 0:
            instance.window()  # may commit itself, as the commit policy says
        if instance.committer.commits == made:
            instance.commit()
        self.commits += 1
        self._dirty = False

    def next_wakeup(self) -> float | None:
        """Seconds until the earliest processing-time timer or the next ``window()`` (by
        ``window_interval``) is due (None: neither): how long the partition may wait for records."""
        instance = self.instance
        due = instance.time.next_processing_timer
        wakeups = [] if due is None else [max(0.0, due - instance.processing_clock())]
        interval = instance.job.window_interval
        if interval:
            since = instance.clock() - instance._last_window  # noqa: SLF001 - maybe_window()'s own clock
            wakeups.append(max(0.0, interval - since))
        return min(wakeups) if wakeups else None

    def finish(self) -> None:
        """End of the epoch (or a stop): commit what is uncommitted and wait for it to be saved."""
        if self._dirty or self.instance.collector.pending:
            self.commit()
        self.instance.settle_commit()
