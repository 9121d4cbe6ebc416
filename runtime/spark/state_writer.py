"""``df.write.format("localstate")``: bootstrap a job's state from a DataFrame (Flink's State
Processor API bootstrap), or write a transformed savepoint back (docs/state-as-data.md).

    (df.select("key", "value")                  # or a "store" column: several stores at once
       .write.format("localstate").option("job", "/abs/job.toml").option("store", "counts")
       .mode("append")                          # "overwrite": replace a job that has state
       .save())

Each Spark task stages its rows as savepoint files (:class:`~localstate.runtime.statedata.bootstrap.StagedWriter`:
each row through the store's engine, routed to its job partition); when every task succeeded the
driver writes the manifest and starts the job from that savepoint (a new state epoch, switched to
atomically); a failed write changes nothing. The staging location (option ``staging``; default a new
folder in the job's directory) must be reachable from every executor: on a cluster give a shared
folder or an object store URL.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Iterator, Mapping

from pyspark.sql.datasource import DataSourceWriter, WriterCommitMessage

from localstate.core.config import load_job_config
from localstate.core.names import safe_join
from localstate.errors import ConfigError
from localstate.runtime.statedata.bootstrap import StagedWriter, commit_bootstrap
from localstate.runtime.statedata.location import SavepointLocation, storage_options
from localstate.runtime.statedata.reader import Savepoint
from localstate.runtime.statedata.writer import check_empty

__all__ = ["WriteOptions", "BootstrapWriter"]


@dataclass(frozen=True)
class WriteOptions:
    """The writer's options, checked (names case-insensitive, as Spark passes them)."""

    job: str
    store: str | None = None
    staging: str | None = None
    savepoint: str | None = None
    key_column: str = "key"
    value_column: str = "value"
    endpoint: str | None = None
    region: str | None = None
    plugins: str | None = None

    NAMES: ClassVar[dict[str, str]] = {"job": "job", "path": "job", "store": "store", "staging": "staging",
                                       "savepoint": "savepoint", "keycolumn": "key_column",
                                       "valuecolumn": "value_column", "endpoint": "endpoint", "region": "region",
                                       "plugins": "plugins"}

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> "WriteOptions":
        values: dict[str, Any] = {}
        for name, value in options.items():
            attribute = cls.NAMES.get(name.lower())
            if attribute is None:
                raise ConfigError.at(f"option {name!r}", "unknown option of the localstate writer",
                                     hint="options: job, store, staging, savepoint, keyColumn, valueColumn, endpoint, "
                                          "region, plugins (docs/state-as-data.md)")
            values[attribute] = value
        if not values.get("job"):
            raise ConfigError.at("option 'job'", "the localstate writer needs the job file",
                                 hint='.option("job", "/abs/path/job.toml")')
        return cls(**values)


@dataclass
class _Staged(WriterCommitMessage):
    files: dict[str, Any]


class BootstrapWriter(DataSourceWriter):
    """Stages each task's rows; the driver's :meth:`commit` starts the job from them."""

    def __init__(self, options: WriteOptions, overwrite: bool, columns: list[str]) -> None:
        self.options = options
        self.overwrite = overwrite
        job = load_job_config(options.job, plugins=options.plugins)
        if options.store is None and "store" not in columns:
            raise ConfigError.at("option 'store'", "name the store (or give the DataFrame a 'store' column)",
                                 hint='.option("store", "counts")')
        for column in (options.key_column, options.value_column):
            if column not in columns:
                raise ConfigError.at(f"column {column!r}", f"the DataFrame has no column {column!r} "
                                     f"(columns: {', '.join(columns)})", hint="select the key and value columns")
        staging = options.staging or str(safe_join(job.state_dir, job.name, "savepoints",
                                                   f"bootstrap-{uuid.uuid4().hex[:12]}"))
        self.location_options = storage_options(staging, job, endpoint=options.endpoint, region=options.region)
        check_empty(SavepointLocation(self.location_options))

    def write(self, iterator: Iterator[Any]) -> _Staged:
        options = self.options
        job = load_job_config(options.job, plugins=options.plugins)
        writer = StagedWriter(job, SavepointLocation(self.location_options))
        for row in iterator:
            fields = row.asDict(recursive=True)
            store = options.store if options.store is not None else fields["store"]
            writer.add(store, fields[options.key_column], fields[options.value_column])
        return _Staged(writer.close())

    def commit(self, messages: list[Any]) -> None:
        options = self.options
        job = load_job_config(options.job, plugins=options.plugins)
        files: dict[str, Any] = {}
        for message in messages:
            files.update(message.files if message is not None else {})
        savepoint = None
        if options.savepoint is not None:
            savepoint = Savepoint.open(SavepointLocation(storage_options(options.savepoint, job,
                                                                         endpoint=options.endpoint,
                                                                         region=options.region)))
        commit_bootstrap(job, SavepointLocation(self.location_options), files, yes=self.overwrite,
                         savepoint=savepoint)

    def abort(self, messages: list[Any]) -> None:
        """Nothing was switched to: the staged files are left for the operator (the staging folder)."""


def absolute(options: Mapping[str, str]) -> dict[str, str]:
    """``options`` with the job file (and a local staging folder) made absolute against this process's
    working directory: the Spark workers may run elsewhere."""
    out = dict(options)
    for name in ("job", "staging", "savepoint", "plugins"):
        for key in [k for k in out if k.lower() == name]:
            if "://" not in out[key]:
                out[key] = str(Path(out[key]).expanduser().resolve())
    return out
