"""The package layering (.importlinter), checked with import-linter on the source tree.

import-linter finds a package's modules by walking its folder, and localstate's subpackages live in
top-level folders mapped by pyproject.toml's ``package-dir``; so the check runs on a staged copy of
the tree laid out as it is installed (``localstate/core/...``), made from that mapping.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CONTRACTS = ROOT / ".importlinter"


def stage_tree(destination: Path) -> Path:
    """Copy every package's Python files to ``destination`` laid out by their import names."""
    mapping = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    for package, folder in mapping.items():
        target = destination.joinpath(*package.split("."))
        for source in (ROOT / folder).rglob("*.py"):
            relative = source.relative_to(ROOT / folder)
            if "__pycache__" in relative.parts:
                continue
            (target / relative).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, target / relative)
    return destination


def lint_imports(tree: Path) -> subprocess.CompletedProcess[str]:
    lint = shutil.which("lint-imports", path=os.path.dirname(sys.executable)) or "lint-imports"
    return subprocess.run([lint, "--no-cache", str(CONTRACTS)], cwd=tree, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(tree)}, timeout=300)


@pytest.fixture(scope="module")
def staged(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return stage_tree(tmp_path_factory.mktemp("layering"))


def test_the_source_tree_keeps_every_layering_contract(staged: Path) -> None:
    result = lint_imports(staged)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout
    # Every contract of the file ran (a contract import-linter skipped would pass silently).
    contracts = CONTRACTS.read_text().count("[importlinter:contract:")
    assert f"Contracts: {contracts} kept, 0 broken." in result.stdout


@pytest.mark.parametrize(("module", "line", "contract"), [
    ("core/engine.py", "import localstate.runtime.partition.instance", "core imports none of"),
    ("core/config.py", "from localstate.engines.kv import engine", "core imports none of"),
    ("engines/heap/topn.py", "import localstate.engines.kv.engine", "engine kinds do not import each other"),
    ("changelog/objectstore/chain.py", "import localstate.changelog.file.system", "changelog systems do not"),
    ("runtime/partition/instance.py", "import localstate.tools.cli", "the runtime imports none of"),
    ("core/names.py", "import localstate.core.config", "no import cycles"),
    ("runtime/partition/stores.py", "import localstate.runtime.driver.progress", "what runs one partition imports"),
    ("runtime/partition/feeder.py", "import localstate.runtime.spark.config", "what runs one partition imports"),
    ("runtime/driver/progress.py", "import localstate.runtime.spark.driver", "the driver's operations"),
    ("runtime/layout.py", "import localstate.runtime.spark.context", "the driver's operations"),
    ("runtime/statedata/loader.py", "import localstate.runtime.spark.state_writer", "state as data"),
    ("runtime/spark/affinity/slots.py", "import localstate.runtime.spark.executor", "no import cycles"),
])
def test_a_violating_import_is_caught(tmp_path: Path, module: str, line: str, contract: str) -> None:
    tree = stage_tree(tmp_path / "tree")
    path = tree / "localstate" / module
    path.write_text(path.read_text() + f"\n{line}  # a violation planted by the test\n")
    result = lint_imports(tree)
    assert result.returncode != 0, result.stdout
    broken = result.stdout[result.stdout.index("Broken contracts"):]
    assert contract in broken, broken
