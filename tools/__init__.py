"""The operator's tools: the ``localstate`` command line and its subcommands (``validate``, ``run``,
``inspect``, ``reset``, ``plugins``). They drive :mod:`localstate.runtime`; nothing imports them but
the CLI entry point."""

__all__: list[str] = []
