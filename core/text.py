"""Small helpers for the words of messages."""

from __future__ import annotations

import re

__all__ = ["a"]

# Words that start with a vowel letter but a consonant sound ("a unique", "a one-off"), and the
# reverse ("an hour"): the exceptions an article chosen by the first letter gets wrong.
_CONSONANT_SOUND = re.compile(r"(one\b|once|uni(?!n)|us|uri|url|utf|uuid|uint|eu)")
_VOWEL_SOUND = ("hour", "honest", "heir")
# Numbers said with a vowel first: 8, 11, 18, 80-89, 800-899, 8000, 11000, 18000 ...
_VOWEL_NUMBER = re.compile(r"(8|11(?!\d)|18(?!\d)|1[18](,?\d{3})+(?![\d,]))")


def a(word: object) -> str:
    """``word`` with its indefinite article: ``a('event-time')`` is ``"an event-time"``,
    ``a('kv')`` is ``"a kv"``, ``a(8)`` is ``"an 8"``. By the sound of the first letters, so
    ``a('unique')`` is ``"a unique"`` and ``a('hour')`` ``"an hour"``."""
    text = str(word)
    low = text.lower()
    vowel = (low.startswith(_VOWEL_SOUND) or _VOWEL_NUMBER.match(low) is not None
             or (low[:1] in ("a", "e", "i", "o", "u") and _CONSONANT_SOUND.match(low) is None))
    return f"{'an' if vowel else 'a'} {text}"
