"""Messages say "an event-time timer", not "a event-time timer" (issue #48): the article before a
word that only exists at run time comes from :func:`localstate.core.text.a`, and no literal text of
the package pairs an article with the wrong sound."""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from localstate.core.text import a

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("core", "runtime", "tools", "engines", "changelog", "streams", "windows", "testing", "src", "demo",
            "native", "bench")
# "A"/"An" only where a sentence starts: elsewhere a capital A is a placeholder ("attempt A on HOST").
_ARTICLE_WORD = re.compile(r"(?<![A-Za-z'`\-_./<])(a|an|(?:^|(?<=[.:] ))(?:A|An)) ([A-Za-z][A-Za-z0-9]*)")
_ARTICLE_BEFORE_VALUE = re.compile(r"(^|[^A-Za-z])[aA]n? $")


@pytest.mark.parametrize("word, expected", [
    ("event", "an event"), ("event-time", "an event-time"), ("input", "an input"), ("error", "an error"),
    ("output", "an output"), ("object", "an object"), ("ordered", "an ordered"), ("kv", "a kv"),
    ("processing", "a processing"), ("heap", "a heap"), ("unique", "a unique"), ("user", "a user"),
    ("uninterrupted", "an uninterrupted"), ("hour", "an hour"), ("one-off", "a one-off"), ("open", "an open"),
    (8, "an 8"), (11, "an 11"), (18, "an 18"), (80, "an 80"), (800, "an 800"), (7, "a 7"), (100, "a 100"),
    (1100, "a 1100"), (11000, "an 11000"), ("InMemoryEngine", "an InMemoryEngine"), ("KeyValueStore", "a KeyValueStore"),
])
def test_the_article_of_a_word(word: object, expected: str) -> None:
    assert a(word) == expected


@settings(max_examples=60, deadline=None)
@given(st.text(alphabet=st.characters(codec="ascii", categories=("L", "N")), min_size=1, max_size=12))
def test_any_word_gets_one_article(word: str) -> None:
    article, _, rest = a(word).partition(" ")
    assert article in ("a", "an") and rest == word


@functools.cache  # one parse of the package for both tests
def _strings() -> list[tuple[str, ast.AST]]:
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            found += [(f"{path.relative_to(ROOT)}:{node.lineno}", node) for node in ast.walk(tree)
                      if isinstance(node, (ast.JoinedStr, ast.Constant))]
    return found


def test_no_article_is_written_before_a_value() -> None:
    """``f"a {word}"`` picks "a" whatever ``word`` is: write ``f"{a(word)}"``."""
    bad = []
    for where, node in _strings():
        if isinstance(node, ast.JoinedStr):
            for text, value in zip(node.values, node.values[1:]):
                if isinstance(text, ast.Constant) and isinstance(value, ast.FormattedValue) \
                        and _ARTICLE_BEFORE_VALUE.search(text.value):
                    bad.append(f"{where}: ...{text.value[-24:]!r}{{...}}")
    assert not bad, "use localstate.core.text.a() for an article before a value:\n" + "\n".join(bad)


def test_no_literal_article_is_wrong() -> None:
    bad = []
    for where, node in _strings():
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            for match in _ARTICLE_WORD.finditer(node.value):
                article, word = match.groups()
                if word.isupper() or len(word) == 1:
                    continue  # an acronym (said letter by letter: "an SST", "an LMDB") or a placeholder
                if article.lower() != a(word).split(" ")[0]:
                    bad.append(f"{where}: {match.group(0)!r}")
    assert not bad, "\n".join(bad)
