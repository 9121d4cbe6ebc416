"""Storage engines, one subpackage per engine kind: ``kv``, ``heap``, ``sketch``, ``search``."""

__all__: list[str] = []
