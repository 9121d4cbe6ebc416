"""CLI commands of the Spark runtime (``localstate run``, ``localstate demo``)."""
