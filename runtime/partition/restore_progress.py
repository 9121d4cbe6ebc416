"""Progress reporting for long restores and jobs: a tqdm bar on a terminal, log lines otherwise."""

from __future__ import annotations

import logging
import sys
import time
from typing import Iterable, Iterator

from localstate.core.changelog import ChangelogRecord, RecordColumns

__all__ = ["RestoreProgress", "restore_progress", "columns_progress"]

log = logging.getLogger("localstate.restore")

#: Restores of fewer records than this stay quiet.
PROGRESS_THRESHOLD = 50_000


class RestoreProgress:
    """Counts records and bytes of one restore; shows a bar (TTY) or logs every few seconds."""

    def __init__(self, label: str, total: int | None) -> None:
        self.label = label
        self.total = total
        self.records = 0
        self.bytes = 0
        self.started = time.monotonic()
        self._last_log = self.started
        self._bar = None
        if total is not None and total >= PROGRESS_THRESHOLD and sys.stderr.isatty():
            from tqdm import tqdm  # lazy: only a restore big enough for a bar, on a terminal, needs it

            self._bar = tqdm(total=total, desc=f"restore {label}", unit="rec", unit_scale=True, leave=False)

    def update(self, records: int, nbytes: int) -> None:
        self.records += records
        self.bytes += nbytes
        if self._bar is not None:
            self._bar.update(records)
            self._bar.set_postfix_str(f"{self.bytes / 1e6:.1f} MB")
            return
        now = time.monotonic()
        if now - self._last_log >= 5.0:
            self._last_log = now
            rate = self.records / max(now - self.started, 1e-9)
            eta = f", eta {(self.total - self.records) / rate:.0f}s" if self.total and rate else ""
            log.info("restoring %s: %d records, %.1f MB, %.0f rec/s%s", self.label, self.records,
                     self.bytes / 1e6, rate, eta)

    def close(self) -> float:
        seconds = time.monotonic() - self.started
        if self._bar is not None:
            self._bar.close()
        if self.records >= PROGRESS_THRESHOLD or seconds >= 5.0:
            log.info("restored %s: %d records, %.1f MB in %.2fs", self.label, self.records, self.bytes / 1e6, seconds)
        return seconds


def restore_progress(records: Iterable[ChangelogRecord], progress: RestoreProgress,
                     chunk: int = 10_000) -> Iterator[ChangelogRecord]:
    """Yield ``records`` while counting them into ``progress`` every ``chunk`` records."""
    count = nbytes = 0
    for record in records:
        count += 1
        nbytes += len(record.key) + (len(record.value) if record.value is not None else 0)
        if count == chunk:
            progress.update(count, nbytes)
            count = nbytes = 0
        yield record
    progress.update(count, nbytes)


def columns_progress(columns: Iterable[RecordColumns], progress: RestoreProgress) -> Iterator[RecordColumns]:
    """Yield ``columns`` while counting each run's records and bytes into ``progress``."""
    for run in columns:
        progress.update(len(run), run.nbytes)
        yield run
