"""The ``[spark]`` table of a job, parsed and validated once into a :class:`SparkConfig`.

The job config (:mod:`localstate.core.config`) keeps ``[spark]`` as the table the file gives: Spark
is this runtime's business, not the plugin contract's. Every entry point that runs a job on Spark
(``localstate run`` and ``validate``, :class:`~.driver.SparkJobRunner`, the DataFrame step) parses it
here, with the run's master, and hands the result on; nothing reads the raw table anywhere else.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping

from localstate.core.config import JobConfig
from localstate.core.options import Option, Removed, parse_duration, validate_options
from localstate.errors import ConfigError, ConfigProblem

__all__ = ["SparkConfig", "SPARK_OPTIONS", "DEFAULT_MASTER", "MODES", "DEFAULT_EPOCH", "is_local_master"]

DEFAULT_MASTER = "local[*]"


def _positive_batch_size(value: Any) -> int:
    if value < 1:
        raise ValueError(f"must be >= 1 (records per partition per micro-batch), got {value!r}")
    return value


MODES = ("micro-batch", "continuous")
"""``[spark] mode`` values: a Spark job per batch, or long-running tasks (:mod:`.continuous`)."""

DEFAULT_EPOCH = 300.0
"""Seconds a continuous run's tasks run before the next epoch starts (``[spark] epoch``)."""


def _mode(value: str) -> str:
    if value not in MODES:
        raise ValueError(f"must be one of {', '.join(repr(m) for m in MODES)}, got {value!r}")
    return value


def _epoch(value: Any) -> float:
    seconds = parse_duration(value)
    if seconds < 1.0:
        raise ValueError(f"must be at least 1s (a continuous epoch's length), got {value!r}")
    return seconds


def _master(value: str) -> str:
    if not value.strip() or any(ord(ch) < 0x20 for ch in value):
        raise ValueError(f"must be a Spark master URL such as 'local[*]' or 'spark://host:7077', got {value!r}")
    return value


def _spark_conf(value: dict[str, Any]) -> dict[str, str | int | float | bool]:
    """Flatten ``conf`` to ``{"spark.x.y": scalar}``: an unquoted dotted TOML key
    (``spark.executor.memory = "2g"``) parses as nested tables, which mean the same dotted key."""
    flat: dict[str, Any] = {}

    def walk(prefix: str, table: dict[str, Any]) -> None:
        for key, item in table.items():
            name = f"{prefix}{key}"
            if isinstance(item, dict):
                walk(name + ".", item)
            elif isinstance(item, (str, int, bool)) or (isinstance(item, float) and math.isfinite(item)):
                flat[name] = item
            else:
                raise ValueError(f"{name!r} must be a string, number or boolean, got {type(item).__name__} {item!r}")
    walk("", value)
    return flat


SPARK_OPTIONS: dict[str, Option | Removed] = {
    "master": Option(str, default=None, parse=_master, doc="Spark master URL (default local[*]; --master overrides)"),
    "batch_size": Option(int, default=None, parse=_positive_batch_size,
                         doc="records per partition per micro-batch (default: all; --batch-size overrides)"),
    "worker_affinity": Option(bool, default=True,
                              doc="local masters: keep each partition open in the Python worker that ran it, with the "
                                  "tuning that goes with it (default true; false: one plain task per partition)"),
    "conf": Option(dict, default=None, parse=_spark_conf, doc="Spark configuration, key -> string/number/bool"),
    "trigger": Option((int, float, str), default=None, parse=parse_duration,
                      doc="processing-time trigger of `localstate run`: a batch starts at most once per this "
                          "interval, e.g. '500ms' (default: as soon as input is there)"),
    "mode": Option(str, default="micro-batch", parse=_mode,
                   doc="how `localstate run` runs a standing job: 'micro-batch' (a Spark job per batch) or "
                       "'continuous' (long-running tasks that follow their inputs, record at a time)"),
    "epoch": Option((int, float, str), default=None, parse=_epoch,
                    doc="continuous mode: how long its long-running tasks run before the driver starts the "
                        "next epoch (snapshots, compaction, fencing), e.g. '5m' (default 5m)"),
    "keep_open": Removed(lambda value: f"write worker_affinity = {'true' if value else 'false'} instead (the one "
                                       "switch of the local-master tuning, kept instances included)"),
    "pythonpath": Removed("write pythonpath in [job] instead: the task's import path is the same on every "
                          "runtime"),
}
"""Every ``[spark]`` key (and the keys of earlier versions, with what to write instead)."""


def is_local_master(master: str) -> bool:
    """True for ``local``, ``local[N]``, ``local[N,F]``, ``local[*]`` (one JVM, one host)."""
    return master == "local" or master.startswith("local[")


@dataclass(frozen=True)
class SparkConfig:
    """``[spark]`` after validation, for one run on one master."""

    master: str = DEFAULT_MASTER
    """the run's master: ``--master`` if given, else ``[spark] master``, else local[*]"""
    batch_size: int | None = None
    trigger: float = 0.0
    """a batch starts at most once per this many seconds (0: as soon as input is there)"""
    conf: Mapping[str, str | int | float | bool] = field(default_factory=dict)
    affinity_setting: bool = True
    """``[spark] worker_affinity`` as the file sets it (see :attr:`worker_affinity`)"""
    mode: str = "micro-batch"
    """``[spark] mode``: one of :data:`MODES`"""
    epoch: float = DEFAULT_EPOCH
    """continuous mode: seconds each epoch's long-running tasks run"""

    @property
    def continuous(self) -> bool:
        return self.mode == "continuous"

    @property
    def local(self) -> bool:
        return is_local_master(self.master)

    @property
    def worker_affinity(self) -> bool:
        """Whether this run uses worker affinity: the setting, on local masters only (on a cluster
        the warm local stores on each host give the affinity instead)."""
        return self.affinity_setting and self.local

    @classmethod
    def parse(cls, table: Mapping[str, Any], *, master: str | None = None, batch_size: int | None = None,
              collect: list[ConfigProblem] | None = None, source: str | None = None) -> "SparkConfig":
        """Validate a ``[spark]`` table; ``master`` and ``batch_size`` (command-line flags) win over
        the table's. Problems are raised in one ConfigError (paths ``spark.<key>``), or appended to
        ``collect`` (and the defaults used)."""
        try:
            checked = validate_options(SPARK_OPTIONS, table, "spark")
        except ConfigError as exc:
            if collect is None:
                raise ConfigError(exc.problems, source=source) from None
            collect.extend(exc.problems)
            checked = validate_options(SPARK_OPTIONS, {}, "spark")
        chosen = master or checked["master"] or DEFAULT_MASTER
        return cls(master=str(chosen),
                   batch_size=batch_size if batch_size is not None else checked["batch_size"],
                   trigger=float(checked["trigger"] or 0.0), conf=dict(checked["conf"] or {}),
                   affinity_setting=bool(checked["worker_affinity"]), mode=str(checked["mode"]),
                   epoch=float(checked["epoch"] if checked["epoch"] is not None else DEFAULT_EPOCH))

    @classmethod
    def of(cls, job: JobConfig, *, master: str | None = None, batch_size: int | None = None) -> "SparkConfig":
        """The job's ``[spark]`` table for a run on ``master`` (raises ConfigError)."""
        return cls.parse(job.spark, master=master, batch_size=batch_size, source=job.source)
