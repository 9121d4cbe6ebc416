# test_my_tasks.py, next to my_tasks.py: run it with `python -m pytest test_my_tasks.py`
from localstate import TaskTestDriver

from my_tasks import PageViewCounter

STORES = {"counts": {"engine": "kv", "key_serde": "string", "value_serde": "int"}}


def test_counts_survive_a_crash_exactly_once():
    with TaskTestDriver(PageViewCounter, stores=STORES) as driver:
        driver.send("page-views", "alice", {"page": "/"})
        driver.commit()
        driver.send("page-views", "alice", {"page": "/about"})
        driver.crash()                 # the uncommitted update is lost ...
        driver.restart()               # ... and its input re-delivered: exactly once
        assert driver.store("counts").get("alice") == 2
