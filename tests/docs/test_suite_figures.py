"""docs/testing.md states the suite's size and time from a recorded run (tests/suite_figures.py), not
typed: the recorded count stays within 10% of the suite as it is."""

from __future__ import annotations

import pytest

from suite_figures import FIGURES, recorded_count  # tests/ is on sys.path (tests/conftest.py)


def test_the_page_includes_the_recorded_figures() -> None:
    page = (FIGURES.parents[2] / "testing.md").read_text(encoding="utf-8")
    assert '--8<-- "testing/suite.md"' in page
    assert recorded_count() is not None, f"{FIGURES} states no count: record a full run (docs/testing.md)"


def test_the_recorded_count_is_current(request: pytest.FixtureRequest) -> None:
    count = recorded_count()
    collected = len(request.session.items)
    if count is None or collected < count // 2:
        pytest.skip(f"a partial run ({collected} tests collected): the figures are about the whole suite")
    assert abs(collected - count) <= 0.1 * count, (
        f"the suite has {collected} tests, {FIGURES.name} says {count}: record a full run again (docs/testing.md)")
