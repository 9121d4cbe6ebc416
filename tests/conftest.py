"""Project-wide test setup: the fault-injection switch, how pytest-xdist spreads the suite over its
workers, and the sweep that kills every process a test session left behind.

The README's ``python -m pytest`` runs on two xdist workers (``-n 2 --dist loadgroup``, see
pyproject.toml); ``python -m pytest -n 0 tests/...`` runs in this process alone (docs/testing.md).
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import signal
import sys
import tempfile
import time
import uuid
import zlib
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from suite_figures import record as record_suite  # noqa: E402
from xdist_support import group_name, kill_processes_carrying, queue_in_order  # noqa: E402

# The test-only switch that arms fault-injection hooks (LOCALSTATE_CRASH_AT, see
# localstate.runtime.partition.faults). Set here, before any test starts a child process or Spark, so the
# children inherit it; production environments never set it.
os.environ["LOCALSTATE_TESTING"] = "1"

# The JVMs the tests start (Spark drivers through spark-submit: the session's SparkContext,
# `localstate run`, the subprocess drivers; the standalone master and workers through spark-class)
# live for seconds to minutes on a few thousand rows, so most of their CPU goes to JIT-compiling
# and to parallel GC threads on two cores. The client compiler alone and the serial collector cut
# a Spark test's CPU time by about 40% (tests/spark, measured), and change nothing a test checks.
# Set before any test starts a child process; a developer's own setting wins.
TEST_JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
for _variable in ("SPARK_SUBMIT_OPTS", "SPARK_DAEMON_JAVA_OPTS"):
    os.environ.setdefault(_variable, TEST_JVM_OPTIONS)

# Hypothesis profiles (docs/testing.md): "dev", the default, explores new examples on every run;
# "ci" (HYPOTHESIS_PROFILE=ci, or CI set as CI services do; .ci/run sets it) runs the same examples
# every time (derandomize: a CI failure reproduces with the same profile), keeps no example database,
# and runs 40 examples where a test sets no number of its own; "thorough" runs 1,000 there, for a
# long local run. None has a deadline: a loaded two-core machine is slow in bursts.
from hypothesis import settings as _hypothesis  # noqa: E402

_hypothesis.register_profile("dev", deadline=None)
_hypothesis.register_profile("ci", deadline=None, derandomize=True, database=None, max_examples=40, print_blob=True)
_hypothesis.register_profile("thorough", deadline=None, max_examples=1000)
_hypothesis.load_profile(os.environ.get("HYPOTHESIS_PROFILE") or ("ci" if os.environ.get("CI") else "dev"))


def write_spark_defaults(options: str) -> Path:
    """A Spark conf directory whose spark-defaults.conf gives executors ``options``: one directory
    per content (checkouts with other options never share it), written once and replaced atomically."""
    content = f"spark.executor.defaultJavaOptions {options}\n"
    folder = Path(tempfile.gettempdir()) / f"localstate-test-spark-conf-{zlib.crc32(content.encode()):08x}"
    folder.mkdir(exist_ok=True)
    defaults = folder / "spark-defaults.conf"
    if not defaults.exists() or defaults.read_text() != content:
        partial = folder / f"spark-defaults.conf.{os.getpid()}"
        partial.write_text(content)
        partial.replace(defaults)
    return folder


# The executors of the standalone cluster (tests/cluster) are JVMs too, started by a worker with the
# options the driver's conf names, not with the variables above: spark-submit reads the
# spark-defaults.conf of SPARK_CONF_DIR, and Spark prepends spark.executor.defaultJavaOptions to the
# spark.executor.extraJavaOptions the library sets (its log4j file) and a job may set. On a local
# master the executor is the driver's JVM and the setting changes nothing.
os.environ.setdefault("SPARK_CONF_DIR", str(write_spark_defaults(TEST_JVM_OPTIONS)))

# Every process a test starts inherits these tokens, whatever it does with its process group or
# session (Spark's JVMs, the standalone cluster, Tansu, SeaweedFS, crash children), and the sweeps
# find them by them. The session token is set once, by the first pytest process (the xdist
# controller, or the only one with -n 0), and inherited by the workers: the controller's sweep,
# after the workers are gone, catches what a killed worker left. The process token is each pytest
# process's own: a worker's sweep must not kill what the other worker is still using.
SESSION_VARIABLE = "LOCALSTATE_TEST_SESSION"
PROCESS_VARIABLE = "LOCALSTATE_TEST_PROCESS"
# kafka-python's clients keep retrying in background threads after a test's broker is gone (a
# module's Spark session, pooled consumers): their WARNINGs ("No node available ...") would land in
# whatever test the same worker runs next, and fail the ones that count warnings. ERRORs still show.
logging.getLogger("kafka").setLevel(logging.ERROR)

os.environ.setdefault(SESSION_VARIABLE, uuid.uuid4().hex)
os.environ[PROCESS_VARIABLE] = uuid.uuid4().hex

# The JVM tests, in three xdist groups, each run by one worker, one test after the other:
# - "spark": the tests that share the session's local SparkContext (the `spark_context` fixture,
#   get-or-create: one JVM per worker process, so only the worker that runs this group starts one);
# - "jvm": the other tests of the `spark` marker, which start JVMs of their own (subprocess drivers,
#   `localstate run`, the transcripts' runner) and share no session with the first group;
# - "cluster": the standalone cluster of tests/cluster (a master, two workers, their executors, and
#   the cluster's Tansu and SeaweedFS), session-scoped on the worker that runs the group.
# Two workers, so that both cores run JVM tests from the start: one worker takes "spark", the other
# "jvm", and whichever is done first "cluster"; the light tests (engines, changelogs, kill -9
# children, Kafka on Tansu, S3 on SeaweedFS) fill in behind them. A test that carries a group's
# marker but uses none of its fixtures joins that group too: it starts a JVM.
SPARK_GROUP, JVM_GROUP, CLUSTER_GROUP = "spark", "jvm", "cluster"
GROUP_FIXTURES = {CLUSTER_GROUP: {"spark_cluster", "live_cluster", "start_driver"}, SPARK_GROUP: {"spark_context"}}
GROUP_MARKERS = {CLUSTER_GROUP: "cluster", SPARK_GROUP: "spark"}

# Where each group enters the controller's queue, as the fraction of the ungrouped (light) tests
# queued before it; groups at the same position queue in this order. All three first: the two
# workers take the first two, the one done first the third, and the light tests come last, small
# units that even out the two workers' ends.
GROUP_QUEUE_POSITION = {SPARK_GROUP: 0.0, JVM_GROUP: 0.0, CLUSTER_GROUP: 0.0}


def group_of(item: pytest.Item) -> str | None:
    """The xdist group of a test that starts or shares a JVM, else None (a light test)."""
    fixtures = set(getattr(item, "fixturenames", ()))
    if fixtures & GROUP_FIXTURES[CLUSTER_GROUP] or item.get_closest_marker(GROUP_MARKERS[CLUSTER_GROUP]) is not None:
        return CLUSTER_GROUP  # a cluster test also carries the spark marker
    if fixtures & GROUP_FIXTURES[SPARK_GROUP]:
        return SPARK_GROUP
    if item.get_closest_marker(GROUP_MARKERS[SPARK_GROUP]) is not None:
        return JVM_GROUP
    return None


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Put every JVM test in its group (an explicit xdist_group mark wins)."""
    for item in items:
        group = group_of(item)
        if group is not None and item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(group))


# -- xdist_group scheduling -------------------------------------------------------------------------
# pytest-xdist's --dist loadgroup learns a test's group from a "@group" suffix its worker appends to
# the node id; pytest 9.2's structured node ids ignore that write, so every test is scheduled alone
# (pytest-xdist issue #1386). Instead each worker writes the groups it collected to a file, and the
# controller's scheduler reads them: the same scheduling, on any pytest version, node ids untouched.

GROUPS_DIR_VARIABLE = "LOCALSTATE_TEST_XDIST_GROUPS"


def _is_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


def pytest_configure(config: pytest.Config) -> None:
    """The controller makes the folder its workers write their groups to (they inherit it)."""
    if not _is_worker(config) and config.getoption("dist", "no") == "loadgroup":
        os.environ[GROUPS_DIR_VARIABLE] = tempfile.mkdtemp(prefix="localstate-xdist-groups-")


@pytest.hookimpl(tryfirst=True)  # before the worker reports its collection to the controller
def pytest_collection_finish(session: pytest.Session) -> None:
    """A worker writes {node id: group} for its xdist_group tests, before it reports the collection."""
    folder = os.environ.get(GROUPS_DIR_VARIABLE)
    if not _is_worker(session.config) or not folder:
        return
    groups = {}
    for item in session.items:
        mark = item.get_closest_marker("xdist_group")
        if mark is not None:
            groups[item.nodeid] = group_name(mark)
    target = Path(folder) / f"{session.config.workerinput['workerid']}.json"
    partial = target.with_suffix(".partial")
    partial.write_text(json.dumps(groups))
    partial.replace(target)


@pytest.hookimpl(tryfirst=True, optionalhook=True)  # ahead of xdist's own LoadGroupScheduling
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """--dist loadgroup with the groups the workers wrote (see above)."""
    folder = os.environ.get(GROUPS_DIR_VARIABLE)
    if config.getoption("dist") != "loadgroup" or not folder:
        return None
    from xdist.scheduler import LoadGroupScheduling

    class WrittenGroupScheduling(LoadGroupScheduling):
        """LoadGroupScheduling whose groups come from the workers' files, read once every worker
        has collected (the controller schedules only then), queued at GROUP_QUEUE_POSITION."""

        groups: dict[str, str] | None = None
        ordered = False

        def _split_scope(self, nodeid: str) -> str:
            if self.groups is None:
                self.groups = {}
                for written in Path(folder).glob("*.json"):
                    self.groups.update(json.loads(written.read_text()))
            return self.groups.get(nodeid) or super()._split_scope(nodeid)

        def _assign_work_unit(self, node: Any) -> None:
            if not self.ordered:  # the first assignment: the queue is complete, nothing taken yet
                self.ordered = True
                queue = queue_in_order(list(self.workqueue.items()), GROUP_QUEUE_POSITION)
                self.workqueue.clear()
                self.workqueue.update(queue)
            super()._assign_work_unit(node)

    return WrittenGroupScheduling(config, log)


def kill_leftover_processes() -> list[int]:
    """SIGKILL every other process that carries this pytest process's token; the session's first
    process (the xdist controller, or the only one) also those of the session's workers."""
    tokens = {PROCESS_VARIABLE: os.environ[PROCESS_VARIABLE]}
    if os.environ.get("PYTEST_XDIST_WORKER") is None:
        tokens[SESSION_VARIABLE] = os.environ[SESSION_VARIABLE]
    return kill_processes_carrying(tokens)


_STARTED = pytest.StashKey[float]()


def pytest_sessionstart(session: pytest.Session) -> None:
    session.config.stash[_STARTED] = time.monotonic()


@pytest.hookimpl(trylast=True)
def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    """With LOCALSTATE_RECORD_SUITE=1, a full run that passed records its count and time for
    docs/testing.md (tests/suite_figures.py)."""
    if not _is_worker(config):
        record_suite(config, terminalreporter.stats, exitstatus, time.monotonic() - config.stash[_STARTED],
                     terminalreporter.write_line)


def pytest_unconfigure(config: pytest.Config) -> None:
    """Kill whatever this process's tests started and left running (fixtures stop their servers; this
    catches an interrupted teardown, a crashed worker, a test that died before its cleanup)."""
    kill_leftover_processes()
    folder = os.environ.get(GROUPS_DIR_VARIABLE)
    if folder and not _is_worker(config):
        for written in Path(folder).glob("*"):
            written.unlink()
        Path(folder).rmdir()


def _sweep_and_die(signum: int, frame: object) -> None:
    """A worker told to stop (SIGTERM, SIGHUP) runs no teardown: kill its processes first."""
    kill_leftover_processes()
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


atexit.register(kill_leftover_processes)
for _signal in (signal.SIGTERM, signal.SIGHUP):
    try:
        signal.signal(_signal, _sweep_and_die)
    except ValueError:  # not the main thread: pytest_unconfigure and atexit still sweep
        pass
