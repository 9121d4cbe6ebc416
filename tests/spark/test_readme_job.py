"""The README's task and job.toml, copied out of the README, validate and run as shown with
`localstate run`, and produce the counts a plain-Python count of the input predicts; the run summary
says where the outputs and the state are."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from localstate.core.config import load_job_config
from localstate.core.stream import open_input

README = Path(__file__).resolve().parents[2] / "README.md"


def _readme_job(directory: Path) -> Path:
    section = README.read_text(encoding="utf-8").split("## A task in 20 lines", 1)[1]
    (directory / "my_tasks.py").write_text(re.search(r"```python\n(.*?)```", section, re.S).group(1))
    job_file = directory / "job.toml"
    job_file.write_text(re.search(r"```toml\n(.*?)```", section, re.S).group(1))
    return job_file


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "localstate", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=600)


@pytest.mark.spark
def test_readme_job_runs_as_shown_and_counts_exactly(tmp_path):
    job_file = _readme_job(tmp_path)
    validated = _cli("validate", "job.toml", cwd=tmp_path)
    assert validated.returncode == 0, validated.stderr
    assert "warning" not in validated.stderr                       # nothing in it is ignored on Spark

    result = _cli("run", "job.toml", "--master", "local[2]", "--until-drained", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    out_dir = tmp_path / "work" / "out" / "counts"
    assert f"output counts: {out_dir}" in result.stdout
    assert f"state: {tmp_path / 'work' / 'state' / 'page-view-counts'}" in result.stdout

    job = load_job_config(job_file)
    views = open_input(job, "page-views")
    expected = Counter(record.key for p in range(job.partitions) for record in views.read(p, 0, views.end_offset(p)))
    latest: dict[str, int] = {}
    for path in sorted(out_dir.glob("*.jsonl")):
        for line in path.read_text().splitlines():
            row = json.loads(line)
            latest[row["key"]] = row["value"]          # one key -> one output partition, in order
    assert latest == dict(expected) and sum(latest.values()) == 2 * 5000
    # the job writes nothing next to itself except under work/
    assert sorted(p.name for p in tmp_path.iterdir() if p.name != "__pycache__") == ["job.toml", "my_tasks.py", "work"]
