"""Every folder the distribution maps to a package counts as localstate's own code in tracebacks:
a new top-level package must not make localstate's frames look like the user's."""

from __future__ import annotations

import importlib
import tomllib
from pathlib import Path

from localstate.core.tracebacks import is_user_file

ROOT = Path(__file__).resolve().parents[2]


def test_every_mapped_package_is_library_code_in_tracebacks():
    mapping = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    for package in mapping:
        module = importlib.import_module(package)
        assert module.__file__ is not None
        assert not is_user_file(module.__file__), package
