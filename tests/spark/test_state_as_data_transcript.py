"""The worked example of docs/state-as-data.md runs as printed: every ``$`` command of its transcript
runs, in order, in a folder holding the guide's snippets (the job, its task, the input and pandas
scripts), and prints the lines the guide shows (``...`` for what varies: a whole line stands for any
number of lines, inside a line for any text). A command whose shown output is an error must fail."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.spark

ROOT = Path(__file__).resolve().parents[2]
GUIDE = ROOT / "docs" / "state-as-data.md"
SNIPPETS = ROOT / "docs" / "snippets" / "state_as_data"


def transcript() -> list[tuple[str, list[str]]]:
    """``(command, shown output lines)`` of the guide's first console block."""
    text = GUIDE.read_text(encoding="utf-8")
    block = text[text.index("```console\n") + len("```console\n"):]
    block = block[:block.index("\n```")]
    steps: list[tuple[str, list[str]]] = []
    for line in block.splitlines():
        if line.startswith("$ "):
            steps.append((line[2:], []))
        else:
            steps[-1][1].append(line)
    return steps


def matches(shown: list[str], printed: list[str]) -> bool:
    """Whether ``printed`` holds ``shown`` in order, ``...`` lines skipping any lines."""
    patterns = [None if line == "..." else re.compile(".*".join(map(re.escape, line.split("..."))) + r"\Z")
                for line in shown]

    def walk(i: int, j: int) -> bool:
        if i == len(patterns):
            return patterns[-1] is None or j == len(printed) if patterns else True
        if patterns[i] is None:
            return any(walk(i + 1, k) for k in range(j, len(printed) + 1))
        return j < len(printed) and bool(patterns[i].match(printed[j])) and walk(i + 1, j + 1)
    return walk(0, 0)


@pytest.mark.slow  # every step of the worked example runs in the default run: tests/spark/test_state_as_data.py, tests/statedata
def test_the_worked_example_runs_as_printed(tmp_path: Path) -> None:
    for name in ("job.toml", "clicks.py", "make_input.py", "read_with_pandas.py"):
        shutil.copy(SNIPPETS / name, tmp_path / name)
    env = {**os.environ, "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]])}
    steps = transcript()
    assert [command.split()[:2] for command, _ in steps][:3] == [["python", "make_input.py"], ["localstate", "run"],
                                                                 ["localstate", "savepoint"]]
    for command, shown in steps:
        result = subprocess.run(command, shell=True, cwd=tmp_path, env=env, capture_output=True, text=True,
                                timeout=900)
        printed = (result.stdout + result.stderr).splitlines()
        failing = any(line.startswith("localstate ") and ": error:" in line for line in shown)
        assert (result.returncode != 0) == failing, (command, result.returncode, printed[-20:])
        assert matches(shown, [line for line in printed if not _spark_log(line)]), (command, shown, printed)


def _spark_log(line: str) -> bool:
    """Lines Spark's JVM and Python workers print on their own (stderr)."""
    return bool(re.match(r"^(\d\d/\d\d/\d\d |\[Stage|WARNING: |Setting default log level|To adjust logging|"
                         r"Using Spark|\s+at |SLF4J)", line))
