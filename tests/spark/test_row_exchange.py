"""The row exchange between a DataFrame batch's apply tasks (runtime/spark/affinity/exchange.py), with real
processes standing for the tasks: every partition with rows is applied exactly once, with its own
rows, by the task whose worker keeps it open when both sides offer; nobody waits for a partner that
keeps its rows; a retried attempt (SIGKILLed first) applies what its slot claimed before."""

from __future__ import annotations

import multiprocessing
import os
import random
import signal
from pathlib import Path

import pyarrow as pa
import pytest

from localstate.runtime.spark.affinity import exchange as exchange_module
from localstate.runtime.spark.affinity.exchange import RowExchange

CTX = multiprocessing.get_context("fork")
HANG = 60  # seconds: a task still running after this is stuck (the exchange's own waits are bounded)


def rows_of(partition: int) -> pa.Table:
    return pa.table({"key": [f"k{partition}-{i}" for i in range(3 + partition)],
                     "seq": list(range(3 + partition))})


def _task(directory: str, slot: int, kept: int | None, has_rows: bool, start: object, out: object,
          kill_after_first: bool = False, wait: float | None = None) -> None:
    if wait is not None:
        exchange_module.WAIT = wait
    exchange = RowExchange(Path(directory), slot)
    offer = exchange.announce(slot, kept)
    start.wait()  # type: ignore[attr-defined]  # every task has announced (Spark starts a batch's tasks together)
    if not has_rows:
        if offer:
            exchange.withdraw()
        out.put((slot, []))  # type: ignore[attr-defined]
        return
    applied = []
    for partition, rows in exchange.assignments({slot: rows_of(slot)}, kept, offer):
        applied.append((partition, rows.to_pydict()))
        if kill_after_first:
            os.kill(os.getpid(), signal.SIGKILL)  # mid-apply: the claim is made, the result never sent
    out.put((slot, applied))  # type: ignore[attr-defined]


def _run(directory: Path, specs: list[dict], wait: float | None = None) -> dict[int, list]:
    """Run one process per task spec (``slot``, ``kept``, ``rows``, ``kill``), released together once
    all have announced; returns each finished slot's applied ``(partition, rows)``."""
    directory.mkdir(parents=True, exist_ok=True)
    start, out = CTX.Barrier(len(specs)), CTX.Queue()
    processes = [CTX.Process(target=_task, args=(str(directory), spec["slot"], spec.get("kept"),
                                                 spec.get("rows", True), start, out, spec.get("kill", False),
                                                 wait)) for spec in specs]
    for process in processes:
        process.start()
    results: dict[int, list] = {}
    for process in processes:
        process.join(HANG)
        assert not process.is_alive(), "a task of the exchange hung"
    while not out.empty():
        slot, applied = out.get()
        results[slot] = applied
    return results


def _applied(results: dict[int, list]) -> dict[int, tuple[int, dict]]:
    """partition -> (slot that applied it, its rows); fails if a partition was applied twice."""
    seen: dict[int, tuple[int, dict]] = {}
    for slot, applied in results.items():
        for partition, rows in applied:
            assert partition not in seen, f"partition {partition} applied twice"
            seen[partition] = (slot, rows)
    return seen


def test_two_workers_that_keep_each_others_partition_swap_rows(tmp_path):
    results = _run(tmp_path / "x", [{"slot": 0, "kept": 1}, {"slot": 1, "kept": 0}])
    applied = _applied(results)
    assert {p: slot for p, (slot, _) in applied.items()} == {0: 1, 1: 0}  # each where it is kept open
    assert all(rows == rows_of(p).to_pydict() for p, (_, rows) in applied.items())


def test_a_partner_that_keeps_its_rows_is_not_waited_for(tmp_path):
    # WAIT longer than HANG: waiting for slot 1's rows would hang the test.
    results = _run(tmp_path / "x", [{"slot": 0, "kept": 1}, {"slot": 1, "kept": None}], wait=10 * HANG)
    applied = _applied(results)
    assert {p: slot for p, (slot, _) in applied.items()} == {0: 0, 1: 1}


def test_a_partner_without_rows_withdraws_its_offer(tmp_path):
    results = _run(tmp_path / "x", [{"slot": 0, "kept": 1}, {"slot": 1, "kept": 0, "rows": False}],
                   wait=10 * HANG)
    assert {p: slot for p, (slot, _) in _applied(results).items()} == {0: 0}


def test_a_task_alone_applies_its_own_rows(tmp_path):
    results = _run(tmp_path / "x", [{"slot": 0, "kept": 1}])
    assert {p: slot for p, (slot, _) in _applied(results).items()} == {0: 0}


@pytest.mark.parametrize("seed", range(12))
def test_random_keepers_apply_every_partition_exactly_once(tmp_path, seed):
    rng = random.Random(seed)
    partitions = rng.randint(2, 5)
    keepers = list(range(partitions)) + [None] * rng.randint(0, 2)
    rng.shuffle(keepers)
    specs = [{"slot": slot, "kept": keepers[slot], "rows": rng.random() > 0.15} for slot in range(partitions)]
    applied = _applied(_run(tmp_path / "x", specs, wait=0.5))
    with_rows = {spec["slot"] for spec in specs if spec["rows"]}
    assert set(applied) == with_rows
    assert all(rows == rows_of(p).to_pydict() for p, (_, rows) in applied.items())


def test_a_retried_attempt_applies_what_its_slot_claimed(tmp_path):
    """Slot 0 takes partition 1's rows (a swap), is SIGKILLed while applying them; its retry runs in
    a fresh worker (keeping nothing) and applies partition 1 again, from the offered file."""
    directory = tmp_path / "x"
    results = _run(directory, [{"slot": 0, "kept": 1, "kill": True}, {"slot": 1, "kept": 0}])
    assert 0 not in results  # killed
    assert [p for p, _ in results[1]] == [0]
    retry = _run(directory, [{"slot": 0, "kept": None}])
    assert [(p, rows) for p, rows in retry[0]] == [(1, rows_of(1).to_pydict())]
