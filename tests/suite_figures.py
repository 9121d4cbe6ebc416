"""The suite's size and time as docs/testing.md states them (issue #48): written by a full run that
passes, started with ``LOCALSTATE_RECORD_SUITE=1``, to docs/snippets/testing/suite.md, which the page
includes; never typed. tests/conftest.py calls :func:`record` at the end of the run.

A full run is the README's test command: the default selection of pyproject.toml's addopts
(``-m 'not slow'``: the long soaks left out), with no paths, ``-k`` or other ``-m``. The figures
state its count and time."""

from __future__ import annotations

import os
import re
import shlex
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
FIGURES = ROOT / "docs" / "snippets" / "testing" / "suite.md"
RECORD_VARIABLE = "LOCALSTATE_RECORD_SUITE"
_COUNT = re.compile(r"\*\*([\d,]+) tests\*\*")


def default_markexpr(config: Any) -> str:
    """The ``-m`` expression of the ini file's addopts ("" if none): the default run's selection."""
    words = config.getini("addopts")
    words = shlex.split(words) if isinstance(words, str) else list(words)
    found = ""
    for index, word in enumerate(words):
        if word == "-m" and index + 1 < len(words):
            found = words[index + 1]
        elif word.startswith("-m") and len(word) > 2 and not word.startswith("--"):
            found = word[2:]
        elif word.startswith("--markexpr="):
            found = word.partition("=")[2]
    return found


def is_full_run(config: Any) -> str | None:
    """None for a run of the whole default suite, else why it is not one (paths named, ``-k``, another
    ``-m`` than the default's, ...)."""
    if [arg for arg in config.args if Path(arg).resolve() != ROOT / "tests"]:
        return "paths were named"
    for option in ("keyword", "deselect", "lf", "ignore"):
        if getattr(config.option, option, None):
            return f"--{option} was given"
    if (getattr(config.option, "markexpr", "") or "") != default_markexpr(config):
        return "-m was given"
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
                       f"{time.strftime('%Y-%m-%d')}, the default selection "
                       f"(`-m {default_markexpr(config)!r}`).\n", encoding="utf-8")
    write_line(f"suite figures recorded in {FIGURES.relative_to(ROOT)}: {count:,} tests, {minutes} min {rest:02d} s")


def recorded_count() -> int | None:
    """The test count :data:`FIGURES` states, None if it states none."""
    if not FIGURES.is_file():
        return None
    found = _COUNT.search(FIGURES.read_text(encoding="utf-8"))
    return int(found.group(1).replace(",", "")) if found else None
