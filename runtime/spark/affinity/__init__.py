"""Worker affinity on local masters (``[spark] worker_affinity``): task instances kept open in the
Python workers between batches (:mod:`.kept`), the driver's side that sends each partition back to
the worker keeping it (:mod:`.slots`), and the DataFrame step's row exchange between workers
(:mod:`.exchange`)."""

__all__: list[str] = []
