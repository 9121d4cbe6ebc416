"""docs/architecture.md's package picture matches the tree: every package of the source (a folder
with an ``__init__.py`` under a folder pyproject.toml maps to ``localstate``) is named there, and every
folder the picture names is a package."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def real_packages() -> set[str]:
    """Source folders that are packages, as repository paths ending in ``/``."""
    mapping = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    found = set()
    for folder in mapping.values():
        for init in (ROOT / folder).rglob("__init__.py"):
            if "__pycache__" not in init.parts:
                found.add(init.parent.relative_to(ROOT).as_posix() + "/")
    return found


def pictured_packages() -> set[str]:
    """The folders named in the text block under "## The packages"."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    section = text[text.index("## The packages"):]
    picture = section[section.index("```text") + 7:]
    picture = picture[:picture.index("```")]
    return set(re.findall(r"(?<![\w/.])((?:[a-z_]+/)+)", picture))


def test_every_package_is_in_the_picture_and_every_pictured_folder_is_a_package() -> None:
    real, pictured = real_packages(), pictured_packages()
    assert real - pictured == set(), f"packages missing from docs/architecture.md's picture: {sorted(real - pictured)}"
    assert pictured - real == set(), f"folders in the picture that are no package: {sorted(pictured - real)}"
