"""The ttl adapters of the contract suite (contract_adapters.TtlKvAdapter) do what they claim: the
expiring one expires entries during a run, and its model says exactly which; the other expires none."""

from __future__ import annotations

from pathlib import Path

import pytest
from contract_adapters import TtlKvAdapter

from localstate.testing.contract import EngineHarness, op_rng


@pytest.mark.parametrize("expiring", [True, False])
def test_the_ttl_adapters_expire_as_their_model_says(tmp_path: Path, expiring: bool) -> None:
    adapter = TtlKvAdapter("rocksdb", expiring=expiring)
    with EngineHarness(adapter, tmp_path / "store") as harness:
        engine = harness.open()
        ops = []
        for step in range(80):
            op = adapter.random_op(op_rng(7, step))
            adapter.apply(engine, op)
            ops.append(op)
        written = {key for op in ops for key in _keys(op[2] if expiring else op)}
        state = adapter.state(engine)
        assert state == adapter.expected_state(ops)
        live = {key for key, _ in state}
        plain = {key for key, _ in TtlKvAdapter.expected_state(TtlKvAdapter("rocksdb"), [
            op[2] if expiring else op for op in ops])}
        if expiring:
            assert plain - live, "nothing expired during the run"
            tombstones = {r.key.decode() for r in harness.records() if r.value is None}
            assert (plain - live) <= tombstones  # purged, not only hidden
        else:
            assert live == plain
        assert written


def _keys(op: tuple) -> list[str]:
    if op[0] in ("put", "delete"):
        return [op[1]]
    if op[0] == "put_all":
        return [key for key, _ in op[1]]
    return list(op[1])

