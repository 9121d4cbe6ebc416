"""The last line of ``localstate run`` (issue #48): its rate is over the time spent in batches, not
over a standing run's wall time, which grows with every idle minute; both times are shown."""

from __future__ import annotations

import re

from hypothesis import given, settings, strategies as st

from localstate.runtime.driver.plan import BatchResult, RunSummary, rate_text, summary_line


def test_a_standing_run_that_idled_shows_its_busy_rate() -> None:
    summary = RunSummary(seconds=600.0, stopped=True)
    for batch in range(3):
        summary.add(BatchResult(batch, records_in=2_000, records_out=10, seconds=2.0))
    line = summary_line(summary)
    assert line == ("stopped: 3 batch(es), 6,000 records in, 30 out, 600.0s (6.0s in batches: 1,000 rec/s), "
                    "lag 0")


def test_few_records_keep_a_decimal() -> None:
    assert rate_text(5, 48.5) == "0.1 rec/s" and rate_text(0, 0.0) == "0 rec/s" and rate_text(50, 2.0) == "25 rec/s"


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 10**6), st.floats(0.001, 100.0)), max_size=8),
       st.floats(0.0, 10**5), st.integers(1, 5))
def test_the_rate_is_records_over_busy_time(batches: list[tuple[int, float]], idle: float, keep: int) -> None:
    summary = RunSummary(keep=keep)  # folded batches count as well
    for number, (records, seconds) in enumerate(batches):
        summary.add(BatchResult(number, records_in=records, seconds=seconds))
    busy = sum(seconds for _, seconds in batches)
    summary.seconds = busy + idle
    shown = re.search(r"\(([\d.]+)s in batches: ([\d,.]+) rec/s\)", summary_line(summary))
    assert shown is not None
    assert abs(float(shown.group(1)) - busy) <= 0.05 + 1e-9 * busy
    records = sum(r for r, _ in batches)
    assert shown.group(2) == rate_text(records, busy).split()[0]
    assert summary.batch_count == len(batches) and summary.records_in == records
