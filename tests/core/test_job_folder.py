"""One base folder for every relative path of a job (issue #37): when job.toml is a symlink, the
folder of the link, not of its target, for state_dir, the policy, the task module, [spark]
pythonpath, inputs and outputs alike (core.policy.job_folder)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from localstate.core.config import job_policy, load_job_config
from localstate.core.policy import ENV_VAR, job_folder
from localstate.core.stream import open_input, open_output
from localstate.core.stream import base_dir, resolve_path
from localstate.core.task import add_task_paths, load_task_class
from localstate.tools.validation import check_job

JOB = """\
[job]
name = "linked"
task = "job_folder_task:T"
state_dir = "state"

[inputs.events]
system = "jsonl"
path = "in"

[outputs.results]
system = "jsonl"
path = "out"

[stores.counts]
engine = "kv"
backend = "memory"

[spark]
pythonpath = ["lib"]
"""

TASK = ("from localstate import StreamTask\n\nclass T(StreamTask):\n    WHERE = {where!r}\n\n"
        "    def process(self, envelope, collector, coordinator):\n        pass\n")


@pytest.fixture
def linked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    """``shared/job.toml`` (the target) and ``ops/job.toml``, a symlink to it; each folder has its own
    task module, plugins.toml, lib/ and in/ (only ops/in exists: a missing input would be a problem)."""
    monkeypatch.delenv(ENV_VAR, raising=False)
    shared, ops = tmp_path / "shared", tmp_path / "ops"
    for folder in (shared, ops):
        (folder / "lib").mkdir(parents=True)
        (folder / "job_folder_task.py").write_text(TASK.format(where=folder.name))
        (folder / "plugins.toml").write_text('[policy]\nmode = "open"\n')
    (shared / "job.toml").write_text(JOB)
    (ops / "in").mkdir()
    (ops / "job.toml").symlink_to(Path("..") / "shared" / "job.toml")
    monkeypatch.chdir(tmp_path)  # neither folder: the current directory must not matter
    saved = list(sys.path)
    yield shared, ops
    sys.path[:] = saved
    sys.modules.pop("job_folder_task", None)


def test_a_symlinked_job_file_resolves_everything_against_the_links_folder(linked):
    shared, ops = linked
    link = ops / "job.toml"
    job = load_job_config(link)
    ops = ops.resolve()
    assert job_folder(link) == ops and job.base_dir == ops and base_dir(job) == ops
    assert job.state_dir == ops / "state"
    assert job.policy.source == str(ops / "plugins.toml")
    assert job_policy(link).source == str(ops / "plugins.toml")
    assert resolve_path(job, "in") == ops / "in"
    assert open_input(job, "events").input_directory() == ops / "in"
    assert open_output(job, "results").location() == ("path", str(ops / "out"))
    sys.modules.pop("job_folder_task", None)
    add_task_paths(job)
    assert str(ops) in sys.path and str(ops / "lib") in sys.path
    assert str(shared.resolve()) not in sys.path and str(shared.resolve() / "lib") not in sys.path
    assert load_task_class(job.task).WHERE == "ops"


def test_validate_of_a_symlinked_job_file_checks_the_links_folder(linked):
    shared, ops = linked
    check = check_job(ops / "job.toml")
    assert check.problems == []  # ops/in exists; shared/in does not
    assert check.job.base_dir == ops.resolve()
    assert sys.modules["job_folder_task"].T.WHERE == "ops"
    sys.modules.pop("job_folder_task", None)
    problems = check_job(shared / "job.toml").problems
    assert [p.path for p in problems] == ["inputs.events.path"]
    assert str(shared.resolve() / "in") in problems[0].message


def test_a_job_file_in_a_symlinked_folder_is_in_the_folder_the_os_resolves(linked, tmp_path):
    shared, _ = linked
    (tmp_path / "alias").symlink_to(shared, target_is_directory=True)
    job = load_job_config(tmp_path / "alias" / "job.toml")
    assert job.base_dir == shared.resolve()  # only the job file's own link is not followed
    assert job.state_dir == shared.resolve() / "state"


def test_a_relative_job_path_through_a_link_and_dot_dot_follows_the_os(linked, tmp_path):
    shared, ops = linked
    (ops / "up").symlink_to(shared / "lib", target_is_directory=True)
    # ops/up/.. is shared (the OS resolves the link first), not ops as a lexical normpath would say.
    assert job_folder(os.path.join("ops", "up", "..", "job.toml")) == shared.resolve()
