"""Whole-job validation: every problem of a job file in one pass (``localstate validate``), and the
input-path check that ``localstate run`` also applies.

:func:`check_job` never stops at the first failing stage: the file's shape, the plugin policy, the
stores, the inputs and outputs (their systems and options, and whether an input's directory exists),
and the task class are all checked, and every problem is returned with its config path. Nothing is
created, connected to or written.
"""

from __future__ import annotations

import os
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from localstate.core.config import JobConfig, load_job_config
from localstate.core.tomlfile import read_toml_file
from localstate.runtime.spark.config import SparkConfig, is_local_master
from localstate.errors import ConfigError, ConfigProblem, LocalStateError, TaskImportTimeout
from localstate.core.changelog import StreamLocations
from localstate.core.stream import DirectoryInput, base_dir, open_input, open_output, overlap_problems, places_overlap
from localstate.core.task import add_task_paths, load_task_class
from localstate.runtime.layout import open_changelog_system, state_places

__all__ = ["IMPORT_TIMEOUT", "JobCheck", "changelog_input_problems", "check_job", "require_valid",
           "window_problems",
           "input_path_problems", "require_input_paths", "spark_notes", "shared_path_notes"]


@dataclass
class JobCheck:
    """What :func:`check_job` found: the (best-effort) job, its problems, and notes that are not errors."""

    job: JobConfig
    problems: list[ConfigProblem] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    task_error: ConfigError | None = None
    """why the task class did not load (it carries the traceback of the task's module)"""


IMPORT_TIMEOUT = 60.0
"""Seconds ``localstate validate`` waits for the task module to import (``--import-timeout``)."""


def check_job(path: str | os.PathLike[str], *, plugins: str | os.PathLike[str] | None = None,
              import_timeout: float | None = IMPORT_TIMEOUT, master: str | None = None) -> JobCheck:
    """Check the job file at ``path`` in full; raises only when the file itself cannot be read.

    ``import_timeout``: give up on a task module still importing after that many seconds (a
    :class:`~localstate.errors.TaskImportTimeout` problem at ``job.task``; the import goes on in a
    daemon thread, see :func:`~localstate.core.task.load_task_class`); None waits for ever.
    ``master``: the Spark master the notes are about (default: the job's ``[spark] master``)."""
    problems: list[ConfigProblem] = []
    data = read_toml_file(path, "job config")  # parsed once: a job with 10k stores is a big file
    job = load_job_config(path, plugins=plugins, collect=problems, data=data)
    check = JobCheck(job, problems)
    # Stream constructors only validate (they connect to nothing), so this is safe without a broker.
    inputs, outputs = {}, {}
    for name in job.inputs:
        try:
            stream = inputs[name] = open_input(job, name)
        except ConfigError as exc:
            problems.extend(exc.problems)
            continue
        except LocalStateError as exc:
            problems.append(ConfigProblem(f"inputs.{name}", exc.message))
            continue
        problems.extend(_missing_path(job, name, stream))
    for name in job.outputs:
        try:
            outputs[name] = open_output(job, name)
        except ConfigError as exc:
            problems.extend(exc.problems)
        except LocalStateError as exc:
            problems.append(ConfigProblem(f"outputs.{name}", exc.message))
    problems.extend(overlap_problems(inputs, outputs, state_places(job)))  # an output over an input destroys it
    problems.extend(changelog_input_problems(job, inputs))
    task = job.task
    if task.count(":") == 1 and all(task.split(":")):  # an absent or malformed task is already reported
        add_task_paths(job)
        try:
            task_class = load_task_class(job.task, timeout=import_timeout)
        except ConfigError as exc:
            problems.extend(exc.problems)
            check.task_error = exc
        else:
            problems.extend(window_problems(job, task_class))
    spark = SparkConfig.parse(job.spark, collect=problems)
    raw_job = data.get("job")
    check.notes.extend(spark_notes(job, master or spark.master,
                                   raw_job=raw_job if isinstance(raw_job, dict) else {}))
    return check


def require_valid(path: str | os.PathLike[str], *, plugins: str | os.PathLike[str] | None = None,
                  import_timeout: float | None = IMPORT_TIMEOUT, master: str | None = None) -> JobCheck:
    """:func:`check_job`, its notes printed as warnings on stderr (``<job file>: warning: ...``) and
    every problem raised at once as one :class:`ConfigError` (carrying where the task's module failed
    to import, if it did): what ``localstate validate`` reports and what ``localstate run`` refuses to
    start with, in the same words."""
    check = check_job(path, plugins=plugins, import_timeout=import_timeout, master=master)
    for note in check.notes:
        print(f"{path}: warning: {note}", file=sys.stderr)
    if check.problems:
        # A task module that hung has its own advice (don't block at import, or --import-timeout).
        hint = check.task_error.hint if isinstance(check.task_error, TaskImportTimeout) else None
        error = ConfigError(check.problems, source=str(path), hint=hint)
        if check.task_error is not None:  # keep where the task's module failed, for the CLI to print
            task_error = check.task_error
            error.traceback, error.traceback_summary = task_error.traceback, task_error.traceback_summary
            error.location = task_error.location
        raise error
    return check


def window_problems(job: JobConfig, task_class: type) -> list[ConfigProblem]:
    """The stores the task's windowed aggregations cannot use (engine, kind, serdes), for the windows
    its source spells out (:func:`localstate.windows.checks.declared_windows`); each problem once."""
    from localstate.windows.checks import declared_windows, store_problems  # CLI start-up: --help does not load windows

    problems: list[ConfigProblem] = []
    for use in declared_windows(task_class):
        problems.extend(p for p in store_problems(use, job) if p not in problems)
    return problems


def _missing_path(job: JobConfig, name: str, stream: object) -> list[ConfigProblem]:
    directory = _input_directory(stream)
    if directory is None or directory.is_dir():
        return []
    what = "does not exist" if not directory.exists() else "is not a directory"
    return [ConfigProblem(f"inputs.{name}.path",
                          f"input directory {directory} {what} (relative paths are relative to the job file)")]


def _input_directory(stream: object) -> Path | None:
    """The directory a file-based input reads (see ``DirectoryInput``), None for other inputs."""
    return stream.input_directory() if isinstance(stream, DirectoryInput) else None


def changelog_input_problems(job: JobConfig, inputs: Mapping[str, Any] | None = None) -> list[ConfigProblem]:
    """Stores whose changelog stream lives where one of the job's inputs reads (a Kafka changelog
    topic ``<topic_prefix><stream>`` named like an input topic, or a changelog directory an input
    reads), each at ``stores.<store>.changelog``: the store would take the input's records for its
    own history, and the first run refuses to start ("no checkpoint ... holds N record(s)").
    ``inputs``: the job's opened inputs, if the caller has them. Needs no broker: the places come
    from the configuration alone."""
    streams = {store.name: store.changelog for store in job.stores.values() if store.changelog is not None}
    if not streams or not job.inputs:
        return []
    if inputs is None:
        inputs = {}
        for name in job.inputs:
            try:
                inputs[name] = open_input(job, name)
            except LocalStateError:
                continue  # reported by the input's own validation
    try:
        system = open_changelog_system(job)
    except LocalStateError:
        return []  # an unusable changelog system is reported by its own validation
    try:
        if not isinstance(system, StreamLocations):
            return []
        places = {store: system.stream_location(stream) for store, stream in streams.items()}
    except LocalStateError:
        return []  # a bad stream name is reported at the store already
    finally:
        system.close()
    problems = []
    for store, place in sorted(places.items()):
        for name, stream in sorted(inputs.items()):
            other = stream.location()
            if other is not None and places_overlap(place, other):
                where = f"Kafka topic {place[1]!r}" if place[0] == "kafka" else f"directory {place[1]}"
                problems.append(ConfigProblem(
                    f"stores.{store}.changelog",
                    f"changelog stream {streams[store]!r} is {where}, where input {name!r} reads: the store would "
                    "restore the input's records as its state (name the changelog apart from the job's inputs, "
                    "or set a [changelogs.kafka] topic_prefix)"))
    return problems


def input_path_problems(job: JobConfig) -> list[ConfigProblem]:
    """Inputs of ``job`` whose directory does not exist (each at ``inputs.<name>.path``)."""
    problems = []
    for name in job.inputs:
        problems.extend(_missing_path(job, name, open_input(job, name)))
    return problems


def require_input_paths(job: JobConfig) -> None:
    """Refuse to run a job whose file-based input directory is missing: a mistyped path would
    otherwise run as an empty input and report success."""
    problems = input_path_problems(job)
    if problems:
        raise ConfigError(problems, source=job.source,
                          hint="fix the path, or create the input first (e.g. the example's make_input.py)")


def spark_notes(job: JobConfig, master: str | None = None, *, raw_job: Mapping[str, Any] | None = None) -> list[str]:
    """Settings the Spark runner does not use, said out loud rather than silently ignored; on a
    cluster ``master`` (``validate``: the job's ``[spark] master``), what needs a shared file system:
    the file changelog, path-based inputs and outputs, a task module next to the job file
    (:func:`shared_path_notes`). ``raw_job``: the file's ``[job]`` table as written, if the caller has
    it (else the file is read again)."""
    raw = _raw_job_table(job.source) if raw_job is None else raw_job
    notes = [f"job.{key}: not used by `localstate run` (Spark commits once per micro-batch; see docs/spark.md); "
             "it applies to the in-process runtime and the TaskTestDriver"
             for key in ("commit_interval", "commit_every", "pipelined_commits") if key in raw]
    cluster = master is not None and not is_local_master(master)
    if cluster and job.changelog_system == "file" and any(s.changelog is not None for s in job.stores.values()):
        notes.append(f"job.changelog: the file changelog on a cluster ({master}) needs state_dir ({job.state_dir}) "
                     "on a file system every executor and the driver see at the same path, with working flock; "
                     "use changelog = \"objectstore\" (S3, HDFS, a shared directory) or \"kafka\" to need none "
                     "(see docs/cluster.md)")
    if cluster:
        notes.extend(shared_path_notes(job, str(master)))
    return notes


def shared_path_notes(job: JobConfig, master: str) -> list[str]:
    """On a cluster ``master``: every path-based input and output (read and written by the executors
    at the driver's path) and the task module when it is imported from the job file's folder or a
    ``job.pythonpath`` folder (imported from that path on every executor). Whether another host
    sees the same directory cannot be told from here, so each is named with what it needs: a file
    system every host mounts at that path, or (the task module) an installed package."""
    notes = []
    for section, names, opener in (("inputs", job.inputs, open_input), ("outputs", job.outputs, open_output)):
        for name in names:
            try:
                place = opener(job, name).location()
            except Exception:  # noqa: BLE001 - a stream that cannot be opened is reported elsewhere
                continue
            if place is not None and place[0] == "path":
                verb = "read" if section == "inputs" else "write"
                notes.append(f"{section}.{name}: on a cluster ({master}) the executors {verb} {place[1]}, the "
                             "driver's path: it must be on a file system every host mounts at that path "
                             "(see docs/cluster.md)")
    folder = _task_folder(job)
    if folder is not None:
        notes.append(f"job.task: on a cluster ({master}) every executor imports {job.task.split(':')[0]!r} from "
                     f"{folder}, the driver's path: put that folder on a file system every host mounts at that path, "
                     "or install the module on every host (pip install, or spark.submit.pyFiles) (see docs/cluster.md)")
    return notes


def _task_folder(job: JobConfig) -> Path | None:
    """The job file's folder or ``job.pythonpath`` folder the task module is found in, else None
    (an installed module, or one that cannot be found)."""
    module = job.task.split(":")[0]
    if not module:
        return None
    folders = [base_dir(job)] + [base_dir(job) / Path(p) for p in job.pythonpath]
    top = module.split(".")[0]
    for folder in folders:
        folder = folder.resolve()
        if (folder / f"{top}.py").is_file() or (folder / top / "__init__.py").is_file():
            return folder
    return None


def _raw_job_table(source: str | None) -> dict:
    """The [job] table as written in the file (to tell settings given explicitly from defaults)."""
    try:
        table = tomllib.loads(Path(source).read_text(encoding="utf-8")).get("job", {}) if source else {}
    except (OSError, ValueError):
        return {}
    return table if isinstance(table, dict) else {}
