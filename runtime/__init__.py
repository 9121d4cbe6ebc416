"""The runtimes: what runs a job's task partitions, in three packages by place:

* :mod:`.partition`: what runs one task partition on any host (:class:`TaskInstance` and its store
  set, feeder, committer and timers; the :class:`PartitionTask` lifecycle);
* :mod:`.driver`: what the job's driver owns (batch plans and results, progress, metrics, read-only
  state views);
* :mod:`.spark`: the Spark glue (the driver loop, the executors, the DataFrame step, the state
  reader, cluster placement, worker affinity).

:mod:`.layout` says where a job's state lives. Nothing in :mod:`localstate.core` imports from here.
"""

__all__: list[str] = []
