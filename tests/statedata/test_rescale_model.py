"""The model test of a rescale: over random jobs holding every kind of state (kv, kv with ttl, heap,
sketch, search, a store merged on rescale, windows and their timers, per-key timers) and random
partition counts P -> N (up and down, 1, non-divisors): a rescale to N (the committed state read in
place; the same count: a savepoint and a start from it) -> run on gives the state and the outputs of
the same job run with N partitions from the start."""

from __future__ import annotations

from pathlib import Path

from hypothesis import HealthCheck, given, settings, strategies as st

from rescale_model import ModelRun, committed_state, model_job
from localstate.runtime.layout import resolve_epoch
from localstate.runtime.statedata.loader import LoadOptions, load_savepoint
from localstate.runtime.statedata.location import SavepointLocation
from localstate.runtime.statedata.reader import Savepoint
from localstate.runtime.statedata.rescale import rescale
from localstate.runtime.statedata.writer import take_savepoint

KEYS = st.sampled_from([f"user-{i}" for i in range(12)] + ["", "ü", "a|b"])
RECORDS = st.lists(st.tuples(KEYS, st.integers(0, 50), st.floats(0, 99, allow_nan=False)), max_size=25)

#: event time at the rescale: windows ending by then close before it, later ones stay open across it
CUT = 50.0


def run_through(root: Path, first: list, second: list, old: int, new: int) -> tuple[dict, dict, dict]:
    """The rescaled run: ``first`` on ``old`` partitions, rescale to ``new`` (the same count: a
    savepoint and a start from it; a rescale by a kept savepoint equals the rescale:
    test_durable_state.py), ``second``: the state right after ``second`` (windows and timers still
    pending), the state and outputs at the end (every window closed)."""
    job = model_job(root, old)
    run = ModelRun(job)
    run.feed(first)
    run.event_time(CUT)
    now = run.close()
    outputs_before = run.outputs()
    if old != new:
        rescale(resolve_epoch(job), new)
    else:
        location = SavepointLocation({"url": str(root / "savepoint")})
        take_savepoint(job, location)
        load_savepoint(Savepoint.open(location), model_job(root, new), LoadOptions(yes=True))
    after = ModelRun(model_job(root, new), now=now)
    after.feed(second)
    pending = after.state()
    after.event_time(500.0)
    now = after.close()
    outputs = {name: sorted(outputs_before[name] + after.outputs()[name]) for name in outputs_before}
    return pending, committed_state(model_job(root, new), now), outputs


def run_from_start(root: Path, first: list, second: list, partitions: int) -> tuple[dict, dict, dict]:
    run = ModelRun(model_job(root, partitions))
    run.feed(first)
    run.event_time(CUT)
    run.feed(second)
    pending = run.state()
    run.event_time(500.0)
    now = run.close()
    return pending, committed_state(model_job(root, partitions), now), run.outputs()


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(first=RECORDS, second=RECORDS, old=st.integers(1, 5), new=st.integers(1, 6))
def test_a_rescaled_job_equals_one_that_ran_with_its_new_partition_count_from_the_start(
        tmp_path_factory, first, second, old, new):
    rescaled = run_through(tmp_path_factory.mktemp("rescaled"), first, second, old, new)
    expected = run_from_start(tmp_path_factory.mktemp("from-start"), first, second, new)
    assert rescaled[0] == expected[0]  # windows, their timers and the per-key timers still pending
    assert rescaled[1] == expected[1]
    assert rescaled[2] == expected[2]
