"""The Spark runtime: runs a job's task partitions as Spark tasks, micro-batch by micro-batch."""

__all__: list[str] = []
