"""Per-commit figures a task partition carries in its checkpoints: how long its commits took and how
long their records waited, as fixed millisecond buckets (:data:`BOUNDS_MS`).

A partition that commits by itself (a continuous run, the in-process runtime) counts every commit it
makes into :class:`CommitStats`, cumulative since it was opened and named by the generation that open
took (:attr:`CommitStats.since`), and writes them into each checkpoint
(:attr:`~localstate.core.checkpoint.Checkpoint.commit_stats`). The driver sees the tasks only through
what they commit (they may run on other hosts): it reads the checkpoints and takes the difference
since its last look (:meth:`CommitStats.since_last`), the figures of the commits made in between;
another generation's figures are all new.

The figures of commit N are known once it ended, after its checkpoint was saved: they reach the
checkpoint of commit N + 1. A partition's last commit before it closes reaches the driver another
way where there is one (a continuous epoch's task returns its figures to the driver), else not at
all. They are figures for the operator, not state: a checkpoint without them (written before they
existed, or by a micro-batch) or with a damaged value reads as having none, never as an error.

Bounded: two histograms of ``len(BOUNDS_MS) + 1`` counts each, whatever the run's length (a count
that would pass :data:`COUNT_LIMIT` starts the figures over).
"""

from __future__ import annotations

import math
from bisect import bisect_left
from dataclasses import dataclass
from typing import Any

__all__ = ["BOUNDS_MS", "COUNT_LIMIT", "Histogram", "CommitStats", "bucket_of"]

BOUNDS_MS = (0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 500.0, 1000.0, 2500.0, 5000.0, 10000.0,
             30000.0, 60000.0, 300000.0)
"""Upper bounds (milliseconds, inclusive, as Prometheus's ``le``) of the buckets; one more bucket takes
everything above the last. A continuous commit takes a few milliseconds, a micro-batch's up to seconds."""

COUNT_LIMIT = 1 << 53
"""A bucket count or a sum (milliseconds) above this is not a plausible figure: a value holding one
reads as absent (and a task's figures start over before reaching it)."""

_BUCKETS = len(BOUNDS_MS) + 1


def bucket_of(ms: float) -> int:
    """The index of the bucket that takes ``ms`` milliseconds (the first bound ``>= ms``)."""
    return bisect_left(BOUNDS_MS, ms)


def _count(value: Any) -> bool:
    return type(value) is int and 0 <= value <= COUNT_LIMIT


def _sum(value: Any) -> bool:
    return type(value) in (int, float) and math.isfinite(value) and 0 <= value <= COUNT_LIMIT


@dataclass(frozen=True)
class Histogram:
    """Counts per bucket of :data:`BOUNDS_MS` (not cumulative) and the sum of what they counted, in
    milliseconds."""

    counts: tuple[int, ...] = (0,) * _BUCKETS
    sum_ms: float = 0.0

    @property
    def count(self) -> int:
        return sum(self.counts)

    def to_json(self) -> dict[str, Any]:
        return {"counts": list(self.counts), "sum_ms": round(self.sum_ms, 6)}

    @classmethod
    def parse(cls, value: Any) -> "Histogram | None":
        """The histogram ``value`` (what :meth:`to_json` wrote) holds, or None for anything else: a
        wrong type, a count or sum out of range, NaN, the wrong number of buckets, extra keys."""
        if not isinstance(value, dict) or set(value) != {"counts", "sum_ms"}:
            return None
        counts, total = value["counts"], value["sum_ms"]
        if not isinstance(counts, list) or len(counts) != _BUCKETS or not all(_count(c) for c in counts) \
                or not _sum(total):
            return None
        return cls(tuple(counts), float(total))

    def observe(self, ms: float) -> "Histogram":
        counts = list(self.counts)
        counts[bucket_of(ms)] += 1
        return Histogram(tuple(counts), self.sum_ms + ms)

    def plus(self, other: "Histogram") -> "Histogram":
        return Histogram(tuple(a + b for a, b in zip(self.counts, other.counts)), self.sum_ms + other.sum_ms)

    def minus(self, earlier: "Histogram") -> "Histogram | None":
        """What was counted since ``earlier``; None if a count went down (the figures started over)."""
        if any(now < before for now, before in zip(self.counts, earlier.counts)):
            return None
        return Histogram(tuple(a - b for a, b in zip(self.counts, earlier.counts)),
                         max(0.0, self.sum_ms - earlier.sum_ms))

    def quantile(self, q: float) -> float | None:
        """The upper bound (milliseconds) of the bucket holding the ``q`` quantile: the quantile is
        at most that. ``math.inf`` if it falls above the last bound, None if nothing was counted."""
        total = self.count
        if not total:
            return None
        rank, seen = q * total, 0
        for index, n in enumerate(self.counts):
            seen += n
            if seen >= rank and n:
                return BOUNDS_MS[index] if index < len(BOUNDS_MS) else math.inf
        return math.inf

    def mean(self) -> float | None:
        total = self.count
        return self.sum_ms / total if total else None


@dataclass(frozen=True)
class CommitStats:
    """A partition's per-commit figures since :attr:`since`, cumulative:

    * :attr:`commit`: each commit's duration, from its start (the due timers fired first) to its
      end: stores flushed, changelogs durable, outputs delivered, checkpoint saved, output
      transactions committed (pipelined: until its checkpoint's save ended, or was skipped for a
      newer one). Its count is the number of commits.
    * :attr:`latency`: per commit that carried input records, how long its oldest record waited
      inside localstate: from the start of the read that returned it (a pull of up to
      :data:`~localstate.runtime.partition.records.CHUNK` records from the input's reader, decoding
      included) to the end of the commit that made its outputs visible. Time the record spent in
      the input before it was read (the poll, the lag) is not in it.
    """

    since: int = 0
    """the generation of the partition's open that started these figures (0 to 2**63-1)"""
    commit: Histogram = Histogram()
    latency: Histogram = Histogram()

    @property
    def commits(self) -> int:
        return self.commit.count

    def to_json(self) -> dict[str, Any]:
        return {"since": self.since, "commit_ms": self.commit.to_json(), "latency_ms": self.latency.to_json()}

    @classmethod
    def parse(cls, value: Any) -> "CommitStats | None":
        """What a checkpoint's ``commit_stats`` holds, or None (absent) for anything :meth:`to_json`
        could not have written. Never raises, never evaluates anything."""
        if not isinstance(value, dict) or set(value) != {"since", "commit_ms", "latency_ms"}:
            return None
        since = value["since"]
        if type(since) is not int or not 0 <= since < 1 << 63:
            return None
        commit, latency = Histogram.parse(value["commit_ms"]), Histogram.parse(value["latency_ms"])
        if commit is None or latency is None or latency.count > commit.count:
            return None  # every latency figure is a commit's
        return cls(since, commit, latency)

    def since_last(self, before: "CommitStats | None") -> "CommitStats":
        """The figures of the commits made since ``before`` (the same partition's figures at an
        earlier look): the difference, or all of these when they started over in between (another
        :attr:`since`, a count that went down, ``before`` None)."""
        if before is None or before.since != self.since:
            return self
        commit, latency = self.commit.minus(before.commit), self.latency.minus(before.latency)
        if commit is None or latency is None:
            return self
        return CommitStats(self.since, commit, latency)

    def plus(self, other: "CommitStats") -> "CommitStats":
        """Both figures summed (the partitions of one progress period); :attr:`since` is this one's."""
        return CommitStats(self.since, self.commit.plus(other.commit), self.latency.plus(other.latency))

    def to_progress(self) -> dict[str, Any]:
        """These figures as a progress object's ``commits`` (a period's, summed over partitions):
        ``count`` commits, ``commit_ms`` and ``latency_ms`` histograms, their bounds ``le_ms``."""
        return {"count": self.commits, "le_ms": list(BOUNDS_MS), "commit_ms": self.commit.to_json(),
                "latency_ms": self.latency.to_json()}

    @classmethod
    def from_progress(cls, value: Any) -> "CommitStats | None":
        """What a progress object's ``commits`` holds (:meth:`to_progress`), or None for anything
        else (other bounds: a file another version wrote). Never raises."""
        if not isinstance(value, dict) or set(value) != {"count", "le_ms", "commit_ms", "latency_ms"} \
                or value["le_ms"] != list(BOUNDS_MS):
            return None
        stats = cls.parse({"since": 0, "commit_ms": value["commit_ms"], "latency_ms": value["latency_ms"]})
        return stats if stats is not None and value["count"] == stats.commits else None
