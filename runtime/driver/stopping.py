"""How a run is stopped (:class:`StopControl`): asked from any thread or a signal handler, a run plans
no further batch; the batch running then may complete for up to a grace period, then it is cancelled.

No Spark here: what cancelling a running batch means is the runner's (``cancel``, given the running
batch's job group)."""

from __future__ import annotations

import logging
import threading
import time
from contextlib import contextmanager
from typing import Callable, Iterator

__all__ = ["StopControl", "STOP_GRACE"]

log = logging.getLogger(__name__)

STOP_GRACE = 10.0
"""Seconds a batch running when a run is stopped may take to complete (and be committed); then its
Spark job group is cancelled and nothing of it is committed."""


class StopControl:
    """A run's stop: :meth:`stop` asks it, the batch loop looks at :attr:`stopping` and sleeps with
    :meth:`wait`, and runs each batch's job inside :meth:`running`, so that a stop can cancel it (with
    ``cancel``, given the job group) once it has had :attr:`grace` seconds to complete."""

    def __init__(self, cancel: Callable[[str], None], grace: float = STOP_GRACE) -> None:
        self.cancel = cancel
        self.grace = grace
        """seconds the batch running at :meth:`stop` may take to complete"""
        self.requested = threading.Event()
        """set by :meth:`stop` (what a wait that a stop should cut short waits on)"""
        self._forced = threading.Event()
        self._running: str | None = None
        """the job group of the batch whose job runs now, if any"""

    def stop(self, force: bool = False) -> None:
        """Ask the run to stop, from any thread or a signal handler: no further batch is planned; a
        batch running now may complete, and be committed, for up to :attr:`grace` seconds, then it is
        cancelled and nothing of it is committed. ``force`` (also after a first stop) does not wait: the
        running batch is cancelled now. A checkpoint save already under way completes (each partition's
        save is atomic). A stopped run stays stopped."""
        if force:
            self._forced.set()
        if self.requested.is_set():
            return
        self.requested.set()
        threading.Thread(target=self._cancel_after_grace, name="localstate-stop", daemon=True).start()

    @property
    def stopping(self) -> bool:
        """True once :meth:`stop` was called."""
        return self.requested.is_set()

    @property
    def forced(self) -> bool:
        """True once :meth:`stop` was called with ``force``."""
        return self._forced.is_set()

    def wait(self, seconds: float) -> bool:
        """Sleep up to ``seconds``, waking up at once on :meth:`stop`; True if stopped."""
        return self.requested.wait(seconds) if seconds > 0 else self.requested.is_set()

    @contextmanager
    def running(self, group: str) -> Iterator[None]:
        """While the body runs, ``group`` is the running batch's job group: what a stop cancels."""
        self._running = group
        try:
            yield
        finally:
            self._running = None

    def _cancel_after_grace(self) -> None:
        deadline = time.monotonic() + self.grace
        while self._running is not None:
            if time.monotonic() >= deadline or self._forced.is_set():
                group = self._running
                if group is None:
                    return
                if self._forced.is_set():
                    log.warning("stopping now: cancelling the running batch (nothing of it is committed)")
                else:
                    log.warning("stopping: the running batch did not complete within %.0fs of the stop; cancelling "
                                "it (nothing of it is committed)", self.grace)
                try:
                    self.cancel(group)
                except Exception:  # noqa: BLE001 - a context already stopped: the batch failed anyway
                    log.debug("cancelling job group %s failed", group, exc_info=True)
                return
            time.sleep(0.05)
