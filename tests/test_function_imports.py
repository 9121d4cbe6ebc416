"""Imports live at the top of a module, where a reader looks for what it depends on; an import inside
a function says why it is not there, in a comment on its line or on the line above (a run of
imports, one statement a line, shares the comment above its first): an import cycle, the CLI's
start-up time (``localstate --help`` does not load pyspark or pyarrow), an optional dependency, a
child process's only heavy import...

The check covers every source folder of the package (pyproject.toml's ``package-dir``) and
``contrib/``, by the syntax tree: an import anywhere inside a function or lambda body counts.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

ALLOWED: dict[str, str] = {}
"""Files whose function-level imports are not checked (repository path -> why)."""

_MARKERS = re.compile(r"noqa(?::\s*[A-Z]+[0-9]+(?:\s*,\s*[A-Z]+[0-9]+)*)?|type:\s*ignore(?:\[[^\]]*\])?|pragma:[^#]*",
                      re.IGNORECASE)


def source_folders() -> list[Path]:
    mapping = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    return sorted({ROOT / folder for folder in mapping.values()} | {ROOT / "contrib"})


def source_files() -> list[Path]:
    return sorted(path for folder in source_folders() for path in folder.rglob("*.py")
                  if "__pycache__" not in path.parts)


def function_level_imports(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """The import statements inside any function or lambda of ``tree``, each once, in line order."""
    found: dict[int, ast.Import | ast.ImportFrom] = {}
    for scope in ast.walk(tree):
        if isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            for node in ast.walk(scope):
                if isinstance(node, (ast.Import, ast.ImportFrom)):
                    found[node.lineno] = node
    return [found[line] for line in sorted(found)]


def comments(source: str) -> dict[int, str]:
    """Line number -> the text of the comment on that line."""
    out = {}
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            out[token.start[0]] = token.string.lstrip("#").strip()
    return out


def is_reason(comment: str | None) -> bool:
    """A comment that says something: not only a linter or type checker marker."""
    return comment is not None and len(re.findall(r"[A-Za-z]", _MARKERS.sub("", comment))) >= 3


def unexplained(path: Path) -> list[str]:
    """``path:line: statement`` of each function-level import without a reason comment."""
    source = path.read_text(encoding="utf-8")
    lines = source.splitlines()
    notes = comments(source)
    out = []
    imports = function_level_imports(ast.parse(source, str(path)))
    ends = {node.end_lineno or node.lineno: node for node in imports}
    for node in imports:
        own_lines = range(node.lineno, (node.end_lineno or node.lineno) + 1)
        if any(is_reason(notes.get(line)) for line in own_lines):
            continue
        first = node  # the first import of the run this one ends
        while first.lineno - 1 in ends:
            first = ends[first.lineno - 1]
        above = first.lineno - 1
        if above >= 1 and lines[above - 1].lstrip().startswith("#") and is_reason(notes.get(above)):
            continue
        name = path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else str(path)
        out.append(f"{name}:{node.lineno}: {lines[node.lineno - 1].strip()}")
    return out


def test_every_function_level_import_says_why_it_is_not_at_the_top() -> None:
    problems = [problem for path in source_files() if path.relative_to(ROOT).as_posix() not in ALLOWED
                for problem in unexplained(path)]
    assert not problems, (
        "imports inside functions without a reason: move each to the module's top, or say on its line "
        "(or the line above) why it cannot be there (e.g. '# import cycle: X imports this module', "
        "'# CLI start-up: pyspark loads ...', '# optional dependency'):\n" + "\n".join(problems))


def test_the_allowed_files_exist_and_still_need_it() -> None:
    for name in ALLOWED:
        path = ROOT / name
        assert path.is_file(), f"{name} is allowed in tests/test_function_imports.py but does not exist: remove it"
        assert unexplained(path), f"{name} has no unexplained function-level import any more: remove it from ALLOWED"


def test_the_check_sees_imports_and_reasons(tmp_path: Path) -> None:
    source = ("def f():\n"
              "    import json\n"
              "    import os  # noqa: PLC0415\n"
              "    # import cycle: a imports this module\n"
              "    import a\n"
              "    import b  # optional dependency\n"
              "    g = lambda: __import__('c')\n"
              "    return (lambda: [__import__('d')])\n"
              "def h():\n"
              "    from e import (x,\n"
              "                   y)  # CLI start-up: e loads pyarrow\n"
              "    try:\n"
              "        # CLI start-up: pyarrow and its readers only when a batch is read\n"
              "        import pyarrow as pa\n"
              "        import pyarrow.json as pj\n"
              "    except ImportError:\n"
              "        import f\n")
    tree = ast.parse(source)
    assert [node.lineno for node in function_level_imports(tree)] == [2, 3, 5, 6, 10, 14, 15, 17]
    notes = comments(source)
    reasons = {line for line in range(1, 18) if is_reason(notes.get(line))}
    assert reasons == {4, 6, 11, 13}  # a bare linter marker is no reason
    sample = tmp_path / "sample.py"
    sample.write_text(source, encoding="utf-8")
    assert [problem.split(":")[1] for problem in unexplained(sample)] == ["2", "3", "17"]
    assert len(source_files()) > 100 and any(function_level_imports(ast.parse(path.read_text(encoding="utf-8")))
                                              for path in source_files())
