"""docs/testing.md states the suite's size and time from a recorded run (tests/suite_figures.py), not
typed: the recorded count stays within 10% of the suite as it is (its default selection: the tests not
marked ``slow``, which pyproject.toml's addopts leave out)."""

from __future__ import annotations

import pytest

from suite_figures import FIGURES, default_markexpr, is_full_run, recorded_count  # tests/ is on sys.path


def test_the_page_includes_the_recorded_figures() -> None:
    page = (FIGURES.parents[2] / "testing.md").read_text(encoding="utf-8")
    assert '--8<-- "testing/suite.md"' in page
    assert recorded_count() is not None, f"{FIGURES} states no count: record a full run (docs/testing.md)"


def test_the_recorded_count_is_current(request: pytest.FixtureRequest) -> None:
    count = recorded_count()
    # What the default run runs, whether this run is one or one with `-m ""` (slow tests too).
    collected = sum(1 for item in request.session.items if item.get_closest_marker("slow") is None)
    if count is None or collected < count // 2:
        pytest.skip(f"a partial run ({collected} tests collected): the figures are about the whole suite")
    assert abs(collected - count) <= 0.1 * count, (
        f"the suite has {collected} tests, {FIGURES.name} says {count}: record a full run again (docs/testing.md)")


def test_the_default_run_is_a_full_run_and_another_selection_is_not(request: pytest.FixtureRequest) -> None:
    config = request.config
    assert default_markexpr(config) == "not slow"  # pyproject.toml's addopts: the figures' selection

    class Option:
        def __init__(self, **given: object) -> None:
            self.__dict__.update({"keyword": "", "deselect": [], "lf": False, "ignore": [],
                                  "markexpr": "not slow", **given})

    class Config:
        def __init__(self, args: list[str], **given: object) -> None:
            self.args, self.option = args, Option(**given)

        def getini(self, name: str) -> object:
            return config.getini(name)

    tests = str(FIGURES.parents[3] / "tests")
    assert is_full_run(Config([tests])) is None
    assert is_full_run(Config([tests], markexpr="")) == "-m was given"
    assert is_full_run(Config([tests], markexpr="slow")) == "-m was given"
    assert is_full_run(Config([tests], keyword="kv")) == "--keyword was given"
    assert is_full_run(Config([tests + "/kv"])) == "paths were named"
