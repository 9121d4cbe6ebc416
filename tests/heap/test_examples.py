"""The plain-Python heap examples (examples/heap/direct: the engine driven without the runtime) run
and check their own results (ordering, crash equivalence)."""

from __future__ import annotations

import runpy
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "heap" / "direct"


@pytest.mark.parametrize("name", ["trending_pages.py", "merge_logs.py"])
def test_example_runs(tmp_path: Path, name: str, capsys: pytest.CaptureFixture[str]) -> None:
    module = runpy.run_path(str(EXAMPLES / name))
    assert module["main"]([str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert ("same result as the run without a crash" in out) if name == "trending_pages.py" \
        else ("lines merged in timestamp order" in out)
