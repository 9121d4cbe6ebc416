"""State as data (docs/state-as-data.md): savepoints, a job's state moved to another partition count,
backend, serde or changelog system, migrations and bootstrap.

* :mod:`.writer` takes a savepoint (committed state read from the durable changelogs and snapshots,
  one checkpoint per partition, as Parquet plus a manifest written last), :mod:`.reader` reads a whole
  one back (checksums), :mod:`.location` is where it is kept (a folder or an object store URL);
* :mod:`.loader` starts a job from a savepoint as a new state epoch, switched to in one atomic step
  (:mod:`localstate.runtime.layout`), re-partitioning every store by :mod:`.routing` and the timers by
  :mod:`.timer_routing`, migrating records by :mod:`.sources`;
* :mod:`.rescale` is ``localstate rescale``: the checks, a savepoint, a start from it.

Nothing here imports Spark: the Spark reader and writer are in :mod:`localstate.runtime.spark`.
"""
