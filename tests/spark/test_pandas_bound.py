"""pandas (issue #48): PySpark's Arrow paths require pandas, and PySpark 4.x warns on each of them that
it "does not yet fully support pandas >= 3.0.0". The project declares the bound it needs
(``pandas>=2.2,<3`` in pyproject.toml), and localstate's DataFrame paths run with that warning made
an error: the DataFrame step (``run_batch``, through ``mapInArrow``) and the state reader."""

from __future__ import annotations

import sys
import tomllib
import warnings
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the tasks module, as the Python workers import it
from dataframe_tasks import read_state

pytestmark = pytest.mark.spark
ROOT = Path(__file__).resolve().parents[2]
UNSUPPORTED = "PySpark does not yet fully support pandas"


def _declared() -> str:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    [pandas] = [dep for dep in project["dependencies"] if dep.replace(" ", "").startswith("pandas")]
    return pandas


def test_the_declared_bound_excludes_pandas_3_and_the_installed_pandas_meets_it() -> None:
    from packaging.requirements import Requirement

    import pandas

    requirement = Requirement(_declared())
    assert "3.0.0" not in requirement.specifier and "2.2.0" in requirement.specifier
    assert pandas.__version__ in requirement.specifier, (
        f"pandas {pandas.__version__} is installed; the project needs {requirement} (pip install -e '.[test]')")


def test_the_dataframe_paths_run_without_the_pandas_warning(spark_context, tmp_path: Path) -> None:
    from pyspark.sql import SparkSession
    from pyspark.sql.pandas.utils import require_minimum_pandas_version

    from localstate.core.config import load_job_config
    from localstate.spark import read_state as read_state_frame, run_batch

    spark = SparkSession(spark_context)
    job_file = tmp_path / "job.toml"  # the state reader reads a job file
    job_file.write_text(f"""
[job]
name = "df-counts"
partitions = 2
task = "dataframe_tasks:CountAndRank"
state_dir = "state"
pythonpath = ["{Path(__file__).resolve().parent}"]
[stores.counts]
engine = "kv"
key_serde = "string"
value_serde = "int"
[stores.top]
engine = "heap"
key_serde = "string"
value_serde = "json"
""")
    job = load_job_config(job_file)
    rows = [{"user": f"user-{i % 7}", "page": f"/p/{i % 3}", "ts": i} for i in range(40)]
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=UNSUPPORTED, category=FutureWarning)
        require_minimum_pandas_version()  # what every PySpark pandas/Arrow path calls first
        out = run_batch(spark.createDataFrame(rows, "user string, page string, ts long"), job, key="user",
                        order_by="ts", batch_id=0).collect()
        state = read_state_frame(spark, str(job_file), store="counts").collect()
    assert len(out) == len(rows)
    counts = read_state(job)[0]
    assert {row.key: row.value for row in state} == counts
