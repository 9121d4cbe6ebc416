"""The suite's size and time as docs/testing.md states them (issue #48): written by a full run that
passes, started with ``LOCALSTATE_RECORD_SUITE=1``, to docs/snippets/testing/suite.md, which the page
includes; never typed. tests/conftest.py calls :func:`record` at the end of the run."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
FIGURES = ROOT / "docs" / "snippets" / "testing" / "suite.md"
RECORD_VARIABLE = "LOCALSTATE_RECORD_SUITE"
_COUNT = re.compile(r"\*\*([\d,]+) tests\*\*")


def is_full_run(config: Any) -> str | None:
    """None for a run of the whole suite, else why it is not one (paths named, ``-k``, ``-m``, ...)."""
    if [arg for arg in config.args if Path(arg).resolve() != ROOT / "tests"]:
        return "paths were named"
    for option in ("keyword", "markexpr", "deselect", "lf", "ignore"):
        if getattr(config.option, option, None):
            return f"--{option} was given"
    return None


def record(config: Any, stats: dict[str, list], exitstatus: int, seconds: float, write_line: Any) -> None:
    """Write :data:`FIGURES` after a full run that passed, when :data:`RECORD_VARIABLE` is set."""
    if not os.environ.get(RECORD_VARIABLE):
        return
    why = is_full_run(config) or (f"the run failed (exit {exitstatus})" if exitstatus != 0 else None)
    if why is not None:
        write_line(f"suite figures not recorded: {why}")
        return
    count = sum(len(stats.get(kind, [])) for kind in ("passed", "failed", "skipped", "xfailed", "xpassed"))
    cores = os.cpu_count() or 0
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    workers = getattr(config.option, "numprocesses", None) or 0
    minutes, rest = divmod(round(seconds), 60)
    FIGURES.parent.mkdir(parents=True, exist_ok=True)
    FIGURES.write_text(f"**{count:,} tests**, {minutes} min {rest:02d} s on {workers or 'one'} xdist worker(s) of a "
                       f"{cores}-core machine (load average {load:.1f} as the run ended), recorded "
                       f"{time.strftime('%Y-%m-%d')}.\n", encoding="utf-8")
    write_line(f"suite figures recorded in {FIGURES.relative_to(ROOT)}: {count:,} tests, {minutes} min {rest:02d} s")


def recorded_count() -> int | None:
    """The test count :data:`FIGURES` states, None if it states none."""
    if not FIGURES.is_file():
        return None
    found = _COUNT.search(FIGURES.read_text(encoding="utf-8"))
    return int(found.group(1).replace(",", "")) if found else None
