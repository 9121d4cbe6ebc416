"""On a cluster master, ``localstate validate`` and ``run`` name every path that only works if every
host sees it at the driver's path: path-based inputs and outputs, and the task module imported from
the job file's folder; nothing of the kind on a local master, nor for an installed task module."""

from __future__ import annotations

from pathlib import Path

from localstate.core.config import load_job_config
from localstate.tools.validation import check_job, spark_notes

JOB = """
[job]
name = "shared"
partitions = 2
task = "{task}"
state_dir = "state"
changelog = "memory"

[inputs.events]
system = "jsonl"
path = "in"

[inputs.demo]
system = "generator"
kind = "page_views"

[outputs.counts]
system = "jsonl"
path = "out/counts"

[stores.counts]
engine = "kv"
backend = "memory"
key_serde = "string"
value_serde = "int"
{spark}
"""


def write(root: Path, task: str = "my_tasks:Counter", spark: str = "") -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "in").mkdir(exist_ok=True)
    (root / "my_tasks.py").write_text("from localstate import StreamTask\n\nclass Counter(StreamTask):\n"
                                      "    def process(self, envelope, collector, coordinator):\n        pass\n")
    (root / "job.toml").write_text(JOB.format(task=task, spark=spark))
    return root / "job.toml"


def test_cluster_master_names_inputs_outputs_and_the_task_folder(tmp_path: Path) -> None:
    job = load_job_config(write(tmp_path))
    assert not [n for n in spark_notes(job, "local[2]") if "cluster" in n]
    notes = spark_notes(job, "spark://h:7077")
    by_path = {note.split(":")[0]: note for note in notes}
    assert str((tmp_path / "in").resolve()) in by_path["inputs.events"]
    assert "inputs.demo" not in by_path  # the generator has no path
    assert str((tmp_path / "out" / "counts").resolve()) in by_path["outputs.counts"]
    assert "'my_tasks'" in by_path["job.task"] and str(tmp_path.resolve()) in by_path["job.task"]
    assert all("docs/cluster.md" in note for note in by_path.values())


def test_an_installed_task_module_is_not_named(tmp_path: Path) -> None:
    job = load_job_config(write(tmp_path, task="localstate.demo.commands:Counter"))
    assert not [n for n in spark_notes(job, "yarn") if n.startswith("job.task")]


def test_validate_uses_the_jobs_own_master(tmp_path: Path) -> None:
    local = check_job(write(tmp_path / "local"))
    assert not [n for n in local.notes if "on a cluster" in n]
    cluster = check_job(write(tmp_path / "cluster", spark='[spark]\nmaster = "spark://h:7077"'))
    assert {n.split(":")[0] for n in cluster.notes if "on a cluster" in n} == {"inputs.events", "outputs.counts",
                                                                               "job.task"}
