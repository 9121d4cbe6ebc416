"""Unit test of the example task without Spark: ``python -m pytest examples/task_api``."""

import sys
from pathlib import Path

from localstate.testing.driver import TaskTestDriver

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the task module next to this file
from word_counts import WordCounts  # noqa: E402

STORES = {"counts": {"engine": "kv", "key_serde": "string", "value_serde": "int"}}


def test_counts_survive_a_crash():
    with TaskTestDriver(WordCounts, stores=STORES, window_interval=60) as driver:
        driver.send("messages", "ada", {"text": "the cat sat"})
        driver.commit()
        driver.send("messages", "ada", {"text": "the cat ran"})   # not committed
        driver.crash()
        driver.restart()                                          # replays the uncommitted message
        assert driver.store("counts").get("ada|cat") == 2
        driver.advance(60)                                        # window() is due
        driver.commit()
        assert driver.outputs("word-counts")[-1] == ("ada|ran", 1)
        assert driver.outputs("sizes") == [("keys", 4)]
