"""Validation of job, store and stream names: they become directory names, so they must never
escape the state directory."""

from __future__ import annotations

import os
import re
from pathlib import Path

from localstate.core.fsutil import check_no_symlinks
from localstate.errors import ConfigProblem, InvalidNameError

__all__ = ["NAME_PATTERN", "RESERVED_JOB_NAMES", "name_problem", "check_name", "safe_join"]

NAME_PATTERN = re.compile(r"[A-Za-z0-9._-]{1,200}")
RESERVED_JOB_NAMES = frozenset({"changelogs", "checkpoints", "stores"})
"""Directory names localstate uses inside a state directory: a job named so would share (and its
``reset`` delete) them."""


def name_problem(name: object, what: str) -> str | None:
    """Return why ``name`` is not a valid ``what`` name, or None if it is valid."""
    if not isinstance(name, str):
        return f"{what} name must be a string, got {type(name).__name__}"
    if name in ("", ".", ".."):
        return f"{what} name {name!r} is not allowed"
    if what == "job" and name in RESERVED_JOB_NAMES:
        return (f"job name {name!r} is reserved (localstate's own directories in the state directory: "
                f"{', '.join(sorted(RESERVED_JOB_NAMES))})")
    if not NAME_PATTERN.fullmatch(name):
        return (f"{what} name {name!r} may only contain letters, digits, '.', '_' and '-' "
                f"(at most 200 characters)")
    return None


def check_name(name: object, what: str, path: str = "") -> str:
    """Return ``name`` if valid, else raise InvalidNameError naming the config path."""
    problem = name_problem(name, what)
    if problem:
        raise InvalidNameError([ConfigProblem(path, problem)],
                               hint=f"rename the {what} using only [A-Za-z0-9._-]")
    return name  # type: ignore[return-value]


def safe_join(root: Path, *names: str, anchor: Path | None = None) -> Path:
    """Join validated names under ``root`` and verify the result stays inside it, and that no
    existing component below ``anchor`` (default ``root``) is a symlink: containment is checked on
    the path as written, never by following links (UnsafePathError)."""
    for name in names:
        check_name(name, "path component")
    root = Path(os.path.abspath(root))
    path = root.joinpath(*names)
    check_no_symlinks(root if anchor is None else anchor, path)
    return path
