"""``system = "generator"``: a deterministic, seeded source of demo events, with no files.

Record ``i`` of partition ``p`` depends only on (seed, kind, p, i): reading any offset range twice
gives the same records, so a retried Spark task or a restarted job re-reads exactly the same input.
Keys are drawn only among users (or ids) that the Kafka-compatible partitioner places in ``p``.

Kinds: ``page_views`` (key user, {"user","page","ts"}), ``profiles`` (key user, {"user","name","zip","ts"}),
``settings`` (key user, {"user","theme","emails","ts"}), ``impressions`` (key impression id,
{"ad","user","ts"}), ``clicks`` (key impression id of an earlier impression, {"ts"}).
"""

from __future__ import annotations

import random
from functools import lru_cache
from typing import Any, ClassVar, Iterator, Mapping

from localstate.core.config import JobConfig, StreamConfig
from localstate.core.options import Option
from localstate.core.partitioner import partition_for

from localstate.core.stream import BadTimestamp, InputRecord, InputStream, StreamSystem

__all__ = ["GeneratorInput", "KINDS", "generate", "users_of_partition"]

KINDS = ("page_views", "profiles", "settings", "impressions", "clicks")
_CHUNK = 1024
_THEMES = ("light", "dark", "auto")
_NAMES = ("ana", "ben", "chen", "dara", "eli", "fatima", "goran", "hana", "ivan", "jun", "kofi", "lena")


@lru_cache(maxsize=64)
def users_of_partition(users: int, partitions: int, partition: int) -> tuple[str, ...]:
    """The user ids ``user-%08d`` (of ``users``) that the partitioner places in ``partition``."""
    found = tuple(u for u in (f"user-{i:08d}" for i in range(users)) if partition_for(u, partitions) == partition)
    return found or ("user-%08d" % 0,)


def _record(kind: str, rng: random.Random, users: tuple[str, ...], index: int, ts: float,
            partition: int) -> tuple[Any, dict[str, Any]]:
    if kind == "page_views":
        user = users[rng.randrange(len(users))]
        return user, {"user": user, "page": f"/page/{rng.randrange(1000):04d}", "ts": ts}
    if kind == "profiles":
        user = users[rng.randrange(len(users))]
        return user, {"user": user, "name": rng.choice(_NAMES), "zip": f"{rng.randrange(10000, 99999)}", "ts": ts}
    if kind == "settings":
        user = users[rng.randrange(len(users))]
        return user, {"user": user, "theme": rng.choice(_THEMES), "emails": rng.random() < 0.5, "ts": ts}
    if kind == "impressions":
        return f"imp-{partition}-{index}", {"ad": f"ad-{rng.randrange(200)}", "user": users[rng.randrange(len(users))],
                                            "ts": ts}
    # clicks: on an impression a little earlier in the same partition (same key -> same partition)
    back = rng.randrange(1, 50)
    return f"imp-{partition}-{max(0, index - back)}", {"ts": ts}


def generate(kind: str, seed: int, partitions: int, partition: int, users: int, rate: float, start_ts: float,
             start: int, end: int) -> Iterator[tuple[int, Any, dict[str, Any]]]:
    """``(offset, key, value)`` for offsets ``[start, end)`` of one generated partition."""
    pool = users_of_partition(users, partitions, partition)
    chunk = start // _CHUNK
    while chunk * _CHUNK < end:
        rng = random.Random(f"{seed}:{kind}:{partition}:{chunk}")
        base = chunk * _CHUNK
        for index in range(base, base + _CHUNK):
            ts = start_ts + index / rate
            key, value = _record(kind, rng, pool, index, ts, partition)
            if index >= end:
                return
            if index >= start:
                yield index, key, value
        chunk += 1


class GeneratorInput(InputStream):
    system = "generator"
    options: ClassVar[Mapping[str, Option]] = {
        "kind": Option(str, choices=KINDS, doc="which events to generate"),
        "events": Option(int, minimum=0, doc="events per partition"),
        "seed": Option(int, default=7, doc="random seed"),
        "users": Option(int, default=10_000, minimum=1, doc="distinct users (across partitions)"),
        "rate": Option((int, float), default=100.0, minimum=1e-9, doc="events per second of event time, per partition"),
        "start_ts": Option((int, float), default=1_700_000_000.0, doc="event time of offset 0 (epoch seconds)"),
    }

    def __init__(self, job: JobConfig, config: StreamConfig) -> None:
        super().__init__(job, config)

    def end_offset(self, partition: int) -> int:
        return self.config["events"]

    def read(self, partition: int, start: int, end: int) -> Iterator[InputRecord]:
        c = self.config
        seconds = self.timestamps.seconds
        for offset, key, value in generate(c["kind"], c["seed"], self.job.partitions, partition, c["users"],
                                           float(c["rate"]), float(c["start_ts"]), start, min(end, c["events"])):
            try:
                yield InputRecord(offset, key, value, seconds(value["ts"]))
            except BadTimestamp as exc:  # start_ts and rate outside the input's timestamp range
                yield InputRecord(offset, None, None, None, exc.problem, repr((key, value)))


class GeneratorStreams(StreamSystem):
    """``generator``: deterministic demo events (an input only)."""

    description = "deterministic demo events (page views, profiles, settings, impressions, clicks)"
    input = GeneratorInput
