"""The counting job of the cluster tests and its plain-Python answer.

Input: the deterministic ``generator`` source (page views keyed by user; no files, so every
executor reads the same records). Task: :class:`gated_task.GatedCount`. The expected outputs and
state are computed here, from the generator, without localstate's runtime."""

from __future__ import annotations

import signal
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from localstate.core.config import JobConfig, load_job_config
from localstate.runtime.layout import open_changelog_system
from localstate.runtime.partition.instance import TaskInstance
from localstate.core.stream import open_output
from localstate.streams.generator import generate

HERE = Path(__file__).resolve().parent
PARTITIONS = 4
EVENTS = 2400
USERS = 300
SPARK_CONF = {
    "spark.executor.memory": "512m",
    # A paused or lost executor is noticed within seconds, not the default two minutes.
    "spark.executor.heartbeatInterval": "1s",
    "spark.network.timeout": "8s",
    "spark.network.timeoutInterval": "1s",
    "spark.task.maxFailures": "8",
}


def write_job(directory: Path, master: str, *, state_dir: Path, changelog: str = "file",
              output: str = "file", local_dir: str | None = None, extra: str = "") -> Path:
    """``directory/job.toml`` (and its ``gate`` directory) for the counting job."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "gate").mkdir(exist_ok=True)
    conf = "\n".join(f'"{key}" = "{value}"' for key, value in SPARK_CONF.items())
    local = f'local_dir = "{local_dir}"' if local_dir is not None else ""
    outputs = (f'[outputs.counts-out]\nsystem = "file"\npath = "{directory / "out"}"' if output == "file" else output)
    (directory / "job.toml").write_text(f"""
[job]
name = "cluster-counts"
partitions = {PARTITIONS}
task = "gated_task:GatedCount"
state_dir = "{state_dir}"
changelog = "{changelog}"
{local}

[inputs.events]
system = "generator"
kind = "page_views"
events = {EVENTS}
users = {USERS}

{outputs}

[stores.counts]
engine = "kv"
key_serde = "string"
value_serde = "int"

{extra}

[spark]
master = "{master}"
pythonpath = ["{HERE}"]

[spark.conf]
{conf}
""")
    return directory / "job.toml"


def expected_outputs(partition: int) -> list[tuple[str, int]]:
    """The running count per key, in input order: what the job must emit for ``partition``."""
    counts: Counter[str] = Counter()
    out = []
    for _, key, _ in generate("page_views", 7, PARTITIONS, partition, USERS, 100.0, 1_700_000_000.0, 0, EVENTS):
        counts[key] += 1
        out.append((key, counts[key]))
    return out


def expected_state(events: int = EVENTS) -> dict[str, int]:
    """The final counts; with ``events``, the counts after the first ``events`` records of every
    partition (the committed state after ``events / batch size`` batches)."""
    return dict(Counter(key for p in range(PARTITIONS) for _, key, _ in
                        generate("page_views", 7, PARTITIONS, p, USERS, 100.0, 1_700_000_000.0, 0, events)))


def actual_outputs(job: JobConfig, partition: int) -> list[tuple[Any, Any]]:
    output = open_output(job, "counts-out")
    try:
        return [(key, value) for key, value in output.read(partition)]
    finally:
        output.close()


def restored_state(job: JobConfig, local_root: Path) -> dict[str, int]:
    """The committed state, restored from the durable changelogs into fresh local stores under
    ``local_root`` (what any new host would get)."""
    state: dict[str, int] = {}
    for partition in range(PARTITIONS):
        instance = TaskInstance(job, partition, open_changelog_system(job), local_root=local_root)
        instance.open()
        try:
            state.update(instance.stores["counts"].engine.all())
        finally:
            instance.close(commit=False)
    return state


def wait_for(pattern: str, directory: Path, timeout: float = 120.0) -> Path:
    """The first file matching ``pattern`` in ``directory`` (a gate file), waiting up to ``timeout``."""
    found = wait_for_or_exit(pattern, directory, None, timeout)
    assert found is not None
    return found


def wait_for_or_exit(pattern: str, directory: Path, writer: int | None, timeout: float = 120.0) -> Path | None:
    """:func:`wait_for`, or None once process ``writer`` (the one that would write the file) is
    gone: either way it will write nothing more. Fails after ``timeout`` seconds of neither."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = sorted(directory.glob(pattern))
        if found:
            return found[0]
        if writer is not None and not Path(f"/proc/{writer}").exists():
            return None
        time.sleep(0.05)
    alive = f" while process {writer} still runs ({_threads_state(writer)})" if writer is not None else ""
    raise AssertionError(f"no {pattern} in {directory} after {timeout:.0f}s{alive}")


def _threads_state(pid: int) -> str:
    """Each thread of ``pid`` as ``name:state:kernel wait``, to tell a stuck process from a slow one."""
    threads = []
    for task in sorted(Path(f"/proc/{pid}/task").glob("*")):
        try:
            state = (task / "stat").read_text().rsplit(")", 1)[1].split()[0]
            threads.append(f"{(task / 'comm').read_text().strip()}:{state}:{(task / 'wchan').read_text()}")
        except OSError:  # the thread ended meanwhile
            continue
    return ", ".join(threads)


def check_exact(job_file: Path, verify_root: Path) -> None:
    """Every partition's outputs and the committed state equal the plain-Python answer."""
    job = load_job_config(job_file)
    for partition in range(PARTITIONS):
        assert actual_outputs(job, partition) == expected_outputs(partition), f"partition {partition}"
    assert restored_state(job, verify_root) == expected_state()


def pid_of(gate_file: Path) -> int:
    """The process that wrote gate file ``<name>-<partition>-<pid>``."""
    return int(gate_file.name.rsplit("-", 1)[1])


@dataclass
class FrozenHost:
    """A host frozen (SIGSTOP) in the middle of a task, whose batch then committed on the other host."""

    worker: Any  #: the frozen host (:class:`localstate.runtime.spark.devcluster.Worker`)
    reached: Path  #: the frozen task's ``reached-<partition>-<pid>`` gate file
    python_groups: set[int]  #: its Python daemon's and workers' process groups
    jvm_groups: set[int]  #: its worker's and executor's process groups
    moved: dict[str, Any]  #: the driver's answer for the batch

    @property
    def task_pid(self) -> int:
        """The frozen task's Python worker process."""
        return pid_of(self.reached)


def freeze_host_mid_batch(cluster: Any, driver: Any, gate: Path, victim: int) -> FrozenHost:
    """Run one batch with partition ``victim``'s task held at its first record, freeze the whole host
    running it (its JVMs and Python processes), release the gate and wait for the driver's answer: the
    executor is declared lost and the batch commits elsewhere (one batch, at least one failed attempt)."""
    (gate / f"hold-{victim}").touch()
    driver.send({"run": 1})
    reached = wait_for(f"reached-{victim}-*", gate)
    worker = cluster.worker_of(reached.read_text())
    python_groups = worker.python_groups()
    jvm_groups = worker.groups() - python_groups
    worker.signal(signal.SIGSTOP)  # the whole host freezes (a network partition, a long GC pause)
    (gate / f"hold-{victim}").unlink()
    moved = driver.answer()
    assert moved.get("batches") == 1 and moved["failed_attempts"] >= 1, moved
    return FrozenHost(worker, reached, python_groups, jvm_groups, moved)
