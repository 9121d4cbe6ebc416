"""Changelog systems, one subpackage each: ``file`` (the embedded default), ``kafka``, ``memory``
(tests and benchmarks only: not durable)."""

__all__: list[str] = []
