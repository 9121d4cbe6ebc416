"""One local SparkContext for the whole test session (JVM start-up is the expensive part)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def spark_context():
    from localstate.runtime.spark.runner import spark_context as make_context

    context = make_context("local[2]", "localstate-tests")
    yield context
    context.stop()
