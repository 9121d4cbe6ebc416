"""The parallel suite's machinery (tests/conftest.py, tests/xdist_support.py): the JVM tests are in
their xdist groups, the controller's queue order, and the sweep of left-behind processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from xdist_support import environment_of, kill_processes_carrying, queue_in_order  # noqa: E402


def test_groups_are_queued_at_their_positions_and_the_rest_keeps_its_order():
    light = [(f"tests/t.py::test_{i}", {}) for i in range(10)]
    queue = [light[0], ("cluster", {}), *light[1:5], ("spark", {}), *light[5:]]
    ordered = queue_in_order(queue, {"spark": 0.0, "cluster": 0.4})
    assert [scope for scope, _ in ordered] == ["spark", *[s for s, _ in light[:4]], "cluster",
                                               *[s for s, _ in light[4:]]]
    assert queue_in_order(light, {"spark": 0.0}) == light  # a group not collected changes nothing
    assert [s for s, _ in queue_in_order([("spark", {}), *light[:2]], {"spark": 1.0})][-1] == "spark"
    # At the same position, in the order the positions name them (not the order they were collected).
    tied = queue_in_order([("cluster", {}), light[0], ("jvm", {}), ("spark", {})],
                          {"spark": 0.0, "jvm": 0.0, "cluster": 0.0})
    assert [scope for scope, _ in tied] == ["spark", "jvm", "cluster", light[0][0]]


def test_the_sweep_kills_the_processes_carrying_the_token_wherever_they_went():
    token = uuid.uuid4().hex
    ours = subprocess.Popen(["sleep", "600"], env={**os.environ, "SWEEP_TEST_TOKEN": token},
                            start_new_session=True)  # its own session: no process-group kill reaches it
    other = subprocess.Popen(["sleep", "600"], env={**os.environ, "SWEEP_TEST_TOKEN": "someone-else"},
                             start_new_session=True)
    try:
        assert environment_of(ours.pid).get("SWEEP_TEST_TOKEN") == token
        assert kill_processes_carrying({"SWEEP_TEST_TOKEN": token}) == [ours.pid]
        assert ours.wait(timeout=30) == -9
        assert other.poll() is None
    finally:
        for process in (ours, other):
            process.kill()
            process.wait()


def test_every_process_a_test_starts_carries_the_sessions_tokens():
    env = subprocess.run([sys.executable, "-c", "import os, json; print(json.dumps(dict(os.environ)))"],
                         capture_output=True, text=True, check=True).stdout
    child = json.loads(env)
    for name in ("LOCALSTATE_TEST_SESSION", "LOCALSTATE_TEST_PROCESS"):
        assert child.get(name) and child[name] == os.environ[name]


def test_jvm_tests_are_in_their_xdist_groups(request):
    items = request.session.items
    spark = [item for item in items if "spark_context" in item.fixturenames]
    cluster = [item for item in items if "spark_cluster" in item.fixturenames]
    # The tests of the spark marker that share no session: they start JVMs of their own.
    own = [item for item in items if item.get_closest_marker("spark") is not None
           and item.get_closest_marker("cluster") is None and "spark_context" not in item.fixturenames]
    if not spark or not cluster or not own:
        pytest.skip("run with the whole suite: this session collected no local-Spark, own-JVM or cluster test")

    def group(item: pytest.Item) -> str | None:
        mark = item.get_closest_marker("xdist_group")
        return mark.args[0] if mark else None

    assert {group(item) for item in spark} == {"spark"}
    assert {group(item) for item in cluster} == {"cluster"}
    assert {group(item) for item in own} == {"jvm"}
    assert group(next(item for item in items if item.nodeid == request.node.nodeid)) is None  # a light test
    folder = os.environ.get("LOCALSTATE_TEST_XDIST_GROUPS")
    if os.environ.get("PYTEST_XDIST_WORKER") and folder:  # on a worker: what it told the controller
        written = json.loads((Path(folder) / f"{os.environ['PYTEST_XDIST_WORKER']}.json").read_text())
        assert {written[item.nodeid] for item in spark} == {"spark"}
        assert {written[item.nodeid] for item in cluster} == {"cluster"}
        assert {written[item.nodeid] for item in own} == {"jvm"}
