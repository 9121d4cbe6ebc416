"""One way to print benchmark results: a readable table, or one JSON object with every figure
and every ratio (``--json``)."""

from __future__ import annotations

import json
import os
import resource
import shutil
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

__all__ = ["Report", "Scratch", "scratch_folder", "timed", "peak_rss_mb"]


def peak_rss_mb() -> float:
    """Peak resident set size of this process, in MiB."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


@contextmanager
def timed() -> Iterator[dict[str, float]]:
    """``with timed() as t: ...`` then ``t["seconds"]``."""
    result: dict[str, float] = {}
    start = time.perf_counter()
    try:
        yield result
    finally:
        result["seconds"] = time.perf_counter() - start


@dataclass
class Scratch:
    """A benchmark run's temporary folder (``work``) and the storage server it started there, if any."""

    work: Path
    server: Any = None


@contextmanager
def scratch_folder(prefix: str) -> Iterator[Scratch]:
    """A fresh temporary folder; when the block ends, the server set on it is stopped and the folder removed."""
    scratch = Scratch(Path(tempfile.mkdtemp(prefix=prefix)))
    try:
        yield scratch
    finally:
        if scratch.server is not None:
            scratch.server.stop()
        shutil.rmtree(scratch.work, ignore_errors=True)


@dataclass
class Report:
    """Rows of figures plus ratios against baselines measured in the same run."""

    name: str
    params: dict[str, Any] = field(default_factory=dict)
    rows: list[dict[str, Any]] = field(default_factory=list)
    ratios: dict[str, float] = field(default_factory=dict)
    targets: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def add(self, system: str, **figures: Any) -> None:
        self.rows.append({"system": system, **figures})

    def ratio(self, label: str, value: float, target: str | None = None) -> None:
        self.ratios[label] = round(value, 4)
        if target:
            self.targets[label] = target

    def emit_with_load_average(self, as_json: bool) -> None:
        """Record the load average at the end (``params["load_average_end"]``), then :meth:`emit`."""
        self.params["load_average_end"] = round(os.getloadavg()[0], 2)
        self.emit(as_json)

    def emit(self, as_json: bool) -> None:
        # Which optional C extensions ran (LOCALSTATE_PURE_PYTHON=1 measures the pure-Python code).
        from localstate.native import status
        extensions = status()
        if as_json:
            json.dump({"benchmark": self.name, "params": self.params, "rows": self.rows, "ratios": self.ratios,
                       "targets": self.targets, "notes": self.notes, "cpus": os.cpu_count(),
                       "c_extensions": extensions}, sys.stdout)
            print()
            return
        print(f"== {self.name} ==  " + "  ".join(f"{k}={v}" for k, v in self.params.items()))
        columns = ["system"] + sorted({k for row in self.rows for k in row} - {"system"})
        table = [columns] + [[_fmt(row.get(c, "")) for c in columns] for row in self.rows]
        widths = [max(len(r[i]) for r in table) for i in range(len(columns))]
        for row in table:
            print("  ".join(cell.rjust(w) if i else cell.ljust(w) for i, (cell, w) in enumerate(zip(row, widths))))
        if self.ratios:
            print("\nratios (same run):")
            for label, value in self.ratios.items():
                target = f"   target {self.targets[label]}" if label in self.targets else ""
                print(f"  {label:<55} {value:>10.3f}{target}")
        for note in self.notes:
            print(f"note: {note}")
        print("note: C extensions: " + ", ".join(f"{name} {state}" for name, state in extensions.items()))


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:,.3f}" if abs(value) < 100 else f"{value:,.0f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)
