"""Fixtures of the search engine tests (support code lives in search_support.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from search_support import corpus  # noqa: E402


@pytest.fixture(scope="session")
def stdlib_docs() -> list[dict]:
    """About 2,000 real paragraphs (stdlib docstrings)."""
    return corpus(2000)
