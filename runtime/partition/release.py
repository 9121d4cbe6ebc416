"""Releasing a task instance whatever fails (:class:`Release`): every step is attempted, so every
store is closed and every lock released even when a step before failed, and the partition can open
again in this process."""

from __future__ import annotations

import logging
from typing import Any, Callable

__all__ = ["Release"]

log = logging.getLogger(__name__)


class Release:
    """The steps that release one task partition's instance, each attempted whatever failed before
    (call it with the step and what it does); :attr:`errors` in order, the first to raise, any later
    one logged as it happens."""

    def __init__(self, partition: int) -> None:
        self.partition = partition
        self.errors: list[BaseException] = []

    def __call__(self, step: Callable[[], Any], what: str) -> None:
        try:
            step()
        except BaseException as exc:  # noqa: BLE001 - every lock is released first, then it is raised
            if self.errors:
                log.warning("task partition %d: %s also failed while releasing the instance: %s: %s",
                            self.partition, what, type(exc).__name__, exc)
            self.errors.append(exc)

    def raise_first(self) -> None:
        """Raise the first error, if a step failed."""
        if self.errors:
            raise self.errors[0]

    def log_first(self) -> None:
        """Log the first error, if a step failed: the release followed a failure, whose error is
        on its way up."""
        if self.errors:
            first = self.errors[0]
            log.warning("task partition %d: releasing the instance after a failure also failed: %s: %s",
                        self.partition, type(first).__name__, first)
