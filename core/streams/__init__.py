"""Input and output stream systems for jobs (file logs, JSON lines, generators, ...)."""

__all__: list[str] = []
