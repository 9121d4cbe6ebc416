"""Testing a task or an engine without Spark: :class:`~localstate.testing.driver.TaskTestDriver` runs
a task on the real engines and changelogs, crashes included (public as ``localstate.TaskTestDriver``);
:mod:`.contract` is the storage-engine contract suite a third-party engine author runs against their
engine."""

__all__: list[str] = []
