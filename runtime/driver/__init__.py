"""What the driver of a job owns, whatever executes the partitions: the plan of a batch and its
results (:mod:`.plan`), planning each batch from the committed checkpoints and saving the returned
ones (:mod:`.planner`), stopping a run (:mod:`.stopping`), progress files and the live heartbeat
(:mod:`.progress`), the Prometheus endpoint (:mod:`.metrics`), and read-only views of a job's
checkpoints, stores and changelogs for ``inspect``, ``status`` and the state reader (:mod:`.views`).

Nothing here imports Spark (:mod:`localstate.runtime.spark`)."""

__all__: list[str] = []
