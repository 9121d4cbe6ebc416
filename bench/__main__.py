"""Dispatch ``python -m bench NAME [--json] [args...]`` to ``bench/NAME.py``'s ``main(argv)``."""

from __future__ import annotations

import importlib
import pkgutil
import sys
from pathlib import Path


def main() -> int:
    here = Path(__file__).parent
    # Modules named *_cases hold a benchmark's workloads; they are not benchmarks themselves.
    names = sorted(m.name for m in pkgutil.iter_modules([str(here)])
                   if m.name != "report" and not m.name.startswith("_") and not m.name.endswith("_cases"))
    if len(sys.argv) < 2 or sys.argv[1] in ("-h", "--help"):
        print("usage: python -m bench NAME [--json] [options]\n\nbenchmarks: " + ", ".join(names))
        return 0  # the list is what `python -m bench` is for (docs/benchmarks.md)
    name = sys.argv[1]
    if name not in names:
        print(f"unknown benchmark {name!r}; available: {', '.join(names)}", file=sys.stderr)
        return 2
    return importlib.import_module(f"bench.{name}").main(sys.argv[2:]) or 0


if __name__ == "__main__":
    sys.exit(main())
