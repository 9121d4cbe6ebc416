"""The contract suite over every built-in engine configuration (see contract_adapters.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from contract_adapters import ALL_ADAPTERS  # noqa: E402

from localstate.testing.contract import EngineAdapter  # noqa: E402


@pytest.fixture(params=ALL_ADAPTERS, ids=lambda adapter: adapter.name)
def adapter(request: pytest.FixtureRequest) -> EngineAdapter:
    return request.param
