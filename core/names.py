"""Validation of job, store and stream names: they become directory names, so they must never
escape the state directory."""

from __future__ import annotations

import re
from pathlib import Path

from localstate.errors import ConfigProblem, InvalidNameError

__all__ = ["NAME_PATTERN", "name_problem", "check_name", "safe_join"]

NAME_PATTERN = re.compile(r"[A-Za-z0-9._-]{1,200}")


def name_problem(name: object, what: str) -> str | None:
    """Return why ``name`` is not a valid ``what`` name, or None if it is valid."""
    if not isinstance(name, str):
        return f"{what} name must be a string, got {type(name).__name__}"
    if name in ("", ".", ".."):
        return f"{what} name {name!r} is not allowed"
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


def safe_join(root: Path, *names: str) -> Path:
    """Join validated names under ``root`` and verify the result stays inside it."""
    for name in names:
        check_name(name, "path component")
    root = root.resolve()
    path = root.joinpath(*names).resolve()
    if path != root and root not in path.parents:
        raise InvalidNameError([ConfigProblem("", f"{path} escapes the state directory {root}")])
    return path
