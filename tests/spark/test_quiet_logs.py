"""Quiet by default (issue #48): a context localstate creates logs Spark at WARN without JVM stack
traces, keeps py4j's Python logger at WARNING, and silences the Spark loggers whose ERROR lines repeat
a failure reported anyway; ``localstate.spark.quiet_logs`` does the same to a session of your own.
The end-to-end checks: tests/spark/test_errors_spark.py (``localstate run``: no Java in stderr) and
tests/docs/test_spark_users_snippets.py (a failed streaming query in the user's own session)."""

from __future__ import annotations

import logging

import pytest

from localstate.runtime.spark.context import REPEATING_LOGGERS, _log4j_settings

pytestmark = pytest.mark.spark


def _settings(text: str) -> dict[str, str]:
    return dict(line.split(" = ", 1) for line in text.splitlines() if " = " in line)


def test_the_log4j_settings() -> None:
    quiet, debug = _settings(_log4j_settings(False)), _settings(_log4j_settings(True))
    assert quiet["rootLogger.level"] == quiet["logger.spark.level"] == "warn"
    assert quiet["appender.console.layout.alwaysWriteExceptions"] == "false"
    assert "%ex" not in quiet["appender.console.layout.pattern"]
    silenced = {quiet[key.replace(".name", ".level")] for key, value in quiet.items() if value in REPEATING_LOGGERS}
    assert silenced == {"off"} and sum(value in REPEATING_LOGGERS for value in quiet.values()) == len(REPEATING_LOGGERS)
    # -vv: the traces go to the debug log
    assert debug["rootLogger.level"] == "info" and debug["appender.console.layout.alwaysWriteExceptions"] == "true"
    assert not any(value in REPEATING_LOGGERS for value in debug.values())


def test_a_session_of_your_own_made_quiet(spark_context) -> None:
    import localstate.spark

    assert logging.getLogger("py4j").getEffectiveLevel() == logging.WARNING  # set by the context localstate made
    localstate.spark.quiet_logs(spark_context)
    log_manager = spark_context._jvm.org.apache.logging.log4j.LogManager
    for name in REPEATING_LOGGERS:
        assert log_manager.getLogger(name).getLevel().toString() == "OFF", name
    assert log_manager.getRootLogger().getLevel().toString() == "WARN"
