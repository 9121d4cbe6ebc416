"""How an idle continuous task waits (:func:`~localstate.runtime.spark.continuous._wait_for_records`),
with stand-in inputs: only when every input can wait, the first input that holds a record wakes it,
and an input that cannot wait (a broker error) makes it sleep out the time instead of failing."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from localstate.errors import InputError
from localstate.runtime.spark import continuous
from localstate.runtime.spark.continuous import _wait_for_records, _waitable, _waits_now


class _Waiting:
    def __init__(self, wakes: bool = False, fails: bool = False, can: bool = True, prompt: bool = True) -> None:
        self.wakes, self.fails, self.can, self.prompt = wakes, fails, can, prompt
        self.calls: list[tuple[dict[int, int], float]] = []

    def can_wait(self) -> bool:
        return self.can

    def wakes_at_once(self) -> bool:
        return self.prompt

    def wait_for_records(self, positions: dict[int, int], timeout: float) -> bool:
        self.calls.append((positions, timeout))
        if self.fails:
            raise InputError("broker gone", stream="a")
        return self.wakes


def _opened(*positions: dict[str, int]) -> list[Any]:
    return [SimpleNamespace(follower=SimpleNamespace(partition=p, instance=SimpleNamespace(position=at.get)))
            for p, at in enumerate(positions)]


def test_waits_only_when_every_input_can() -> None:
    waiting = _Waiting()
    assert _waitable({"a": waiting, "b": waiting}) == {"a": waiting, "b": waiting}
    assert _waitable({"a": waiting, "b": object()}) == {}  # type: ignore[dict-item]
    assert _waitable({"a": waiting, "b": _Waiting(can=False)}) == {}  # e.g. no inotify: probed
    assert _waitable({}) == {}


def test_busy_tasks_wait_only_on_inputs_whose_wait_wakes_at_once() -> None:
    prompt, late = _Waiting(), _Waiting(prompt=False)  # inotify; a broker's waiting fetch
    assert _waits_now({"a": prompt}, idle=False) and _waits_now({"a": prompt}, idle=True)
    assert not _waits_now({"a": prompt, "b": late}, idle=False)  # busy: keep probing
    assert _waits_now({"a": prompt, "b": late}, idle=True)
    assert not _waits_now({}, idle=True)


def test_each_input_waits_on_the_group_positions_and_the_first_with_a_record_wakes(monkeypatch) -> None:
    quiet, woken = _Waiting(), _Waiting(wakes=True)
    assert _wait_for_records({"a": quiet, "b": woken}, _opened({"a": 3, "b": 7}, {"a": 4, "b": 9}), 10.0, 0.01)
    assert quiet.calls[0][0] == {0: 3, 1: 4} and woken.calls[0][0] == {0: 7, 1: 9}
    assert quiet.calls[0][1] <= 0.01  # several inputs take short turns
    alone = _Waiting()
    assert not _wait_for_records({"a": alone}, _opened({"a": 0}), 0.05, 0.01)
    assert alone.calls and alone.calls[0][1] > 0.01  # one input waits the whole time at once


def test_an_input_that_cannot_wait_sleeps_instead_then_the_round_probes(monkeypatch) -> None:
    slept: list[float] = []
    monkeypatch.setattr(continuous.time, "sleep", slept.append)
    failing = _Waiting(fails=True)
    assert _wait_for_records({"a": failing}, _opened({"a": 0}), 0.5, 0.05)  # True: the next round probes
    assert len(failing.calls) == 1 and len(slept) == 1 and 0 < slept[0] <= 0.5
