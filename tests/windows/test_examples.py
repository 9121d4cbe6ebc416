"""The windowed-counts example (examples/windowed_counts/windowed_counts.py and its job.toml) through
TaskTestDriver: the generator's page views plus late ones, a crash and restart in the middle, and
the hourly counts exact against plain Python. (Spark runs it in tests/spark/test_spark_runtime.py.)"""

from __future__ import annotations

import runpy
import shutil
from collections import Counter
from pathlib import Path

import pytest

from localstate.core.config import load_job_config
from localstate.streams.generator import generate
from localstate.testing.driver import TaskTestDriver

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "windowed_counts"


@pytest.mark.parametrize("task", ["HourlyPageViews", "HourlyPageViewsBatch"])
def test_windowed_counts_example_exact_across_a_crash(tmp_path: Path, task: str) -> None:
    shutil.copytree(EXAMPLE, tmp_path / "job", ignore=shutil.ignore_patterns(".work", "__pycache__"))
    job = load_job_config(tmp_path / "job" / "job.toml")
    module = runpy.run_path(str(tmp_path / "job" / "windowed_counts.py"))
    hour = module["HOUR"]
    options = job.inputs["page_views"].options
    expected: Counter = Counter()
    with TaskTestDriver(module[task], job=job) as driver:
        for partition in range(job.partitions):
            rows = list(generate("page_views", options["seed"], job.partitions, partition, options["users"],
                                 float(options["rate"]), 1_700_000_000.0, 0, 6000))
            counts: Counter = Counter()
            high = float("-inf")
            stamps = []
            for i, (_, user, value) in enumerate(rows):
                ts = value["ts"] - (2 * hour if i % 997 == 996 else 0.0)  # now and then a view two hours late
                stamps.append(ts)
                high = max(high, ts)
                if (ts // hour + 1) * hour > high:  # its hour is still open: counted
                    counts[(user, int(ts // hour))] += 1
            # in chunks of 500 (a batch task gets each as a batch, a stream task record by record)
            for start in range(0, len(rows), 500):
                chunk = rows[start:start + 500]
                driver.send_batch("page_views", [user for _, user, _ in chunk], [value for *_, value in chunk],
                                  partition=partition, timestamps=stamps[start:start + 500])
                if start == 2500:
                    driver.commit()
                if start == 4000:
                    driver.crash()
                    driver.restart()  # the records after the commit are delivered again
            # the hours the partition's final watermark closed are sent; the last one is still open
            expected.update({key: n for key, n in counts.items() if (key[1] + 1) * hour <= high})
        driver.commit()
        sent: Counter = Counter()
        for user, value in driver.outputs("hourly-counts"):
            assert (user, value["hour"]) not in sent, "a window was sent twice"
            sent[(user, value["hour"])] = value["count"]
    assert expected and sent == expected
