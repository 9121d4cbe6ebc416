"""What the driver of a job owns, whatever executes the partitions: the plan of a batch and its
results (:mod:`.plan`), progress files and the live heartbeat (:mod:`.progress`), the Prometheus
endpoint (:mod:`.metrics`), and read-only views of a job's checkpoints, stores and changelogs for
``inspect``, ``status`` and the state reader (:mod:`.views`).

Nothing here imports Spark (:mod:`localstate.runtime.spark`)."""

__all__: list[str] = []
