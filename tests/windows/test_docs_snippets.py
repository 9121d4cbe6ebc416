"""The windows guide's example (docs/snippets/time/page_stats.py with its job file page_stats.toml):
four aggregations over out-of-order page views, each output exact against the reference model,
per job partition."""

from __future__ import annotations

import runpy
import shutil
from collections import Counter
from pathlib import Path

from localstate.core.config import load_job_config
from localstate.core.partitioner import partition_for
from localstate.testing.driver import TaskTestDriver
from localstate.windows.reference import reference_windows, watermarks

SNIPPETS = Path(__file__).resolve().parents[2] / "docs" / "snippets" / "time"


def test_page_stats_outputs_match_the_reference(tmp_path: Path) -> None:
    shutil.copy(SNIPPETS / "page_stats.py", tmp_path / "page_stats.py")
    shutil.copy(SNIPPETS / "page_stats.toml", tmp_path / "job.toml")
    job = load_job_config(tmp_path / "job.toml")
    module = runpy.run_path(str(tmp_path / "page_stats.py"))
    stream = module["views"]()
    with TaskTestDriver(module["PageStats"], job=job) as driver:
        for user, view, ts in stream:
            driver.send("page_views", user, view, timestamp=ts)
        driver.commit()
        task = driver.instances[0].task
        sent = {name: [(k, v["start"], v["end"], v["value"]) for k, v in driver.outputs(name)]
                for name in ("views", "bytes", "latency", "sessions")}
        late = driver.outputs("late-views")
    lag = job.time.allowed_lateness
    expected: dict[str, list] = {name: [] for name in sent}
    expected_late = []
    by_page = dict(zip(("views", "bytes", "latency"), task.by_page))
    for partition in range(job.partitions):
        mine = [(user, view, ts) for user, view, ts in stream if partition_for(user, job.partitions) == partition]
        marks = watermarks([ts for *_, ts in mine], lag)
        for name, aggregation in [*by_page.items(), ("sessions", task.by_user)]:
            key_of = (lambda user, view: user) if name == "sessions" else (lambda user, view: view["page"])
            result = reference_windows([(key_of(u, v), v, ts, w) for (u, v, ts), w in zip(mine, marks)],
                                       aggregation.window, aggregation.aggregate,
                                       emit="update" if name == "views" else "final", lateness=aggregation.lateness)
            expected[name] += [(k, w.start, w.end, value) for k, w, value in result.outputs]
            if name == "sessions":
                expected_late += result.late
    assert all(expected.values()) and expected_late
    assert sent["views"] == expected["views"]  # update: every change, in order
    for name in ("bytes", "latency", "sessions"):
        assert Counter(map(repr, sent[name])) == Counter(map(repr, expected[name])), name
    assert late == expected_late
