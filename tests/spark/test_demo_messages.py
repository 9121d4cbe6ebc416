"""`localstate demo` says where its work directory is, that a temporary one is removed (and that --dir
keeps it), and where the outputs and the state are; a kept directory can be inspected."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from localstate.tools.cli import main
from localstate.demo import run_demo


@pytest.mark.spark
def test_demo_temp_directory_is_announced_and_removed(spark_context):
    lines: list[str] = []
    assert run_demo(events=3000, partitions=2, kill=False, context=spark_context, out=lines.append) == 0, \
        "\n".join(lines)
    first = next(line for line in lines if line.startswith("work directory"))
    root = Path(re.match(r"work directory (\S+):", first).group(1))
    assert "removed at the end" in first and "--dir" in first
    assert lines[-1] == f"removed {root} (run with --dir DIR to keep the outputs and state)"
    assert not root.exists()
    assert any("verification: OK" in line for line in lines)


@pytest.mark.spark
def test_demo_with_dir_keeps_results_and_they_can_be_inspected(tmp_path, spark_context, capsys):
    lines: list[str] = []
    assert run_demo(events=3000, partitions=2, kill=False, directory=str(tmp_path), context=spark_context,
                    out=lines.append) == 0, "\n".join(lines)
    text = "\n".join(lines)
    assert f"work directory {tmp_path.resolve()}: kept after the run" in text
    assert f"state                 {tmp_path.resolve() / 'state'}" in text
    assert f"localstate inspect {tmp_path.resolve() / 'demo.toml'}" in text
    assert not any(line.startswith("removed ") for line in lines)
    capsys.readouterr()
    assert main(["inspect", str(tmp_path / "demo.toml"), "--json"]) == 0
    view = json.loads(capsys.readouterr().out)
    assert set(view["checkpoints"]) == {"0", "1"} and all(view["checkpoints"].values())
    assert all(row["local_offset"] == row["checkpoint_offset"] for row in view["stores"]
               if row["backend"] in ("rocksdb", "lmdb") and row["checkpoint_offset"] is not None)
