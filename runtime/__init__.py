"""The runtimes: what runs a job's task partitions.

* :mod:`.instance`: :class:`~localstate.runtime.instance.TaskInstance`, one task partition in this
  process (open and recover its stores, feed the task, commit);
* :mod:`.records`: the one feed loop's parts (envelopes, the input error policy);
* :mod:`.spark`: the same partitions as Spark tasks (the driver, the executors, the DataFrame step,
  the state reader, cluster placement).

Nothing in :mod:`localstate.core` imports from here.
"""

__all__: list[str] = []
