"""Timer namespaces (``context.timers.namespace``): a namespace's timers fire through its own
``on_fire`` with its own key serde, in one order with the task's own timers; a task needs no
``on_timer`` for them; registering twice keeps one and namespaces never collide; bad names,
duplicate opens, unknown stored namespaces and failing callbacks are typed errors."""

from __future__ import annotations

import runpy
from pathlib import Path
from typing import Any

import pytest

from localstate.core.serdes import IntSerde
from localstate.core.task import StreamTask
from localstate.core.time import TIMER_STORE, TimerNamespace
from localstate.errors import ConfigError, InvalidValueError, TaskError
from localstate.runtime.partition import timers as timer_module
from localstate.runtime.partition.timer_entries import MAX_NAMESPACE, split_entry
from localstate.testing.driver import TaskTestDriver

TIMERS = {"timers": True, "timer_backend": "rocksdb"}


class Spaces(StreamTask):
    """Input value ``[namespace, op, domain, timestamp]`` for the record's key (namespace "" is the
    task's own); "ints" keys are ints (its own serde), "json" any JSON value. Every firing is sent
    to "fired" as ``[namespace, domain, timestamp]``; a firing of "json" at 50 registers a timer
    due already in "ints" and one in the task's own (registered while firing)."""

    own = True

    def init(self, context):
        self.timers = context.timers
        self.spaces = {"json": context.timers.namespace("json", self.json_fired),
                       "ints": context.timers.namespace("ints", self.ints_fired, key_serde="int")}
        if self.own:
            self.spaces[""] = context.timers

    def process(self, envelope, collector, coordinator):
        name, op, domain, ts = envelope.value
        getattr(self.spaces[name], f"{op}_{domain}_time")(envelope.key, ts)

    def json_fired(self, key, timestamp, collector, coordinator):
        collector.send("fired", key, ["json", self.timers.firing_domain, timestamp])
        if timestamp == 50.0:
            self.spaces["ints"].register_event_time(7, 1.0)
            if self.own:
                self.timers.register_event_time("again", 50.0)

    def ints_fired(self, key, timestamp, collector, coordinator):
        collector.send("fired", key, ["ints", self.timers.firing_domain, timestamp])

    def on_timer(self, key, timestamp, collector, coordinator):
        collector.send("fired", key, ["", self.timers.firing_domain, timestamp])


class OnlySpaces(Spaces):
    """Namespaces only: no on_timer (and its own timers refused)."""

    own = False
    on_timer = StreamTask.on_timer


def driver(task: type = Spaces, time: dict | None = None, **kwargs) -> TaskTestDriver:
    return TaskTestDriver(task, time={**TIMERS, **(time or {})}, **kwargs)


@pytest.mark.parametrize("chunk", [2, 16384])
def test_namespaces_share_one_order_and_fire_through_their_own_callbacks(monkeypatch, chunk) -> None:
    monkeypatch.setattr(timer_module, "SCAN_CHUNK", chunk)
    with driver(time={"timer_key_serde": "string"}) as d:
        d.send("in", "k", ["", "register", "event", 20.0], timestamp=0.0)
        d.send("in", 5, ["ints", "register", "event", 20.0], timestamp=0.0)
        d.send("in", ["a", 1], ["json", "register", "event", 20.0], timestamp=0.0)
        d.send("in", "k", ["json", "register", "event", 10.0], timestamp=0.0)
        d.send("in", "k", ["json", "register", "event", 10.0], timestamp=0.0)     # the same timer: kept once
        d.send("in", "k", ["", "register", "event", 10.0], timestamp=0.0)         # another namespace: another
        d.send("in", "k", ["json", "register", "event", 50.0], timestamp=0.0)
        d.send("in", 9, ["ints", "register", "processing", 3.0], timestamp=0.0)
        d.send("in", 6, ["ints", "register", "event", 30.0], timestamp=0.0)
        d.send("in", 6, ["ints", "delete", "event", 30.0], timestamp=0.0)
        d.advance(5)
        d.advance_event_time(100.0)
        d.commit()
        assert d.outputs("fired") == [
            (9, ["ints", "processing", 3.0]),                                      # at the advance(5)
            ("k", ["", "event", 10.0]), ("k", ["json", "event", 10.0]),            # ties: namespace "" first,
            ("k", ["", "event", 20.0]), (5, ["ints", "event", 20.0]),              # then by name length, name
            (["a", 1], ["json", "event", 20.0]), ("k", ["json", "event", 50.0]),
            (7, ["ints", "event", 1.0]), ("again", ["", "event", 50.0])]           # registered while firing


def test_a_task_with_namespaces_only_needs_no_on_timer_and_its_own_timers_stay_refused() -> None:
    with driver(OnlySpaces) as d:
        d.send("in", 1, ["ints", "register", "event", 5.0], timestamp=0.0)
        d.send("in", "x", ["json", "register", "processing", 2.0], timestamp=0.0)
        d.advance(3)
        d.advance_event_time(10.0)
        d.commit()
        assert d.outputs("fired") == [("x", ["json", "processing", 2.0]), (1, ["ints", "event", 5.0])]
        with pytest.raises(ConfigError) as caught:
            d.instances[0].time.register_event_time("own", 1.0)
        assert caught.value.problems[0].path == "job.task" and "on_timer" in caught.value.hint


def test_namespace_keys_use_the_namespace_serde_whatever_the_jobs() -> None:
    """The job's timer_key_serde (int here) is the task's own; a namespace's default is json."""
    with driver(time={"timer_key_serde": "int"}) as d:
        d.send("in", {"user": "é", "n": [1, 2]}, ["json", "register", "event", 1.0], timestamp=0.0)
        d.send("in", 12, ["", "register", "event", 1.0], timestamp=0.0)
        d.advance_event_time(2.0)
        assert d.outputs("fired", pending=True) == [(12, ["", "event", 1.0]),
                                                    ({"n": [1, 2], "user": "é"}, ["json", "event", 1.0])]
        with pytest.raises(InvalidValueError) as caught:
            d.send("in", "not an int", ["ints", "register", "event", 5.0], timestamp=0.0)
        assert "'ints'" in caught.value.hint and caught.value.context["store"] == TIMER_STORE
        with pytest.raises(InvalidValueError, match="finite timestamp.*namespace 'json'"):
            d.send("in", "k", ["json", "register", "event", float("nan")], timestamp=0.0)


def test_namespaced_timers_survive_restarts_and_uncommitted_firings_fire_again() -> None:
    with driver(OnlySpaces) as d:
        d.send("in", 1, ["ints", "register", "event", 10.0], timestamp=0.0)
        d.send("in", "b", ["json", "register", "event", 20.0], timestamp=0.0)
        d.commit()
        for watermark, firing in ((15.0, 1), (30.0, 2)):     # fired, not committed: rolled back by the crash
            d.advance_event_time(watermark)
            assert len(d.outputs("fired", pending=True)) == firing
            d.crash()
            d.restart()
        d.advance_event_time(100.0)
        d.commit()
        assert d.outputs("fired") == [(1, ["ints", "event", 10.0]), ("b", ["json", "event", 20.0])]


class Opener(StreamTask):
    """Opens the namespaces its class lists; registers a timer in "a" for each record."""

    opens: list[tuple[Any, ...]] = [("a",)]

    def init(self, context):
        self.opened = [context.timers.namespace(args[0], self.fired, *args[1:]) for args in self.opens]

    def process(self, envelope, collector, coordinator):
        self.opened[0].register_event_time(envelope.key, envelope.value)

    def fired(self, key, timestamp, collector, coordinator):
        collector.send("fired", key, timestamp)


def opener(*opens: tuple[Any, ...]) -> type:
    return type("Opens", (Opener,), {"opens": list(opens)})


@pytest.mark.parametrize("name", ["", "a\x00b", "x" * (MAX_NAMESPACE + 1), "é" * 128, "\ud800", 5, None, b"a"])
def test_a_bad_namespace_name_is_a_config_error(name) -> None:
    with pytest.raises(ConfigError) as caught:
        driver(opener((name,)))
    assert caught.value.problems[0].path == "job.task" and "namespace" in str(caught.value)


@pytest.mark.parametrize("name", ["x" * MAX_NAMESPACE, "é" * 127, "windows:counts|a b", "\U0001f600"])
def test_a_namespace_name_up_to_its_limit_works(name) -> None:
    with driver(opener((name,))) as d:
        d.send("in", "k", 1.0, timestamp=0.0)
        d.advance_event_time(2.0)
        assert d.outputs("fired", pending=True) == [("k", 1.0)]


def test_opening_a_namespace_twice_returns_it_and_another_callback_or_serde_is_refused() -> None:
    with driver(opener(("a",), ("a",), ("a", "json"))) as d:
        task = d.instances[0].task
        assert task.opened[0] is task.opened[1] is task.opened[2]
        assert isinstance(task.opened[0], TimerNamespace) and task.opened[0].name == "a"
    for second in [("a", "string"), ("a", IntSerde())]:
        with pytest.raises(ConfigError, match="open already"):
            driver(opener(("a",), second))

    class TwoCallbacks(Opener):
        def init(self, context):
            context.timers.namespace("a", self.fired)
            context.timers.namespace("a", lambda *args: None)

    with pytest.raises(ConfigError, match="open already"):
        driver(TwoCallbacks)


@pytest.mark.parametrize("key_serde, match", [("nope", "nope"), (3.5, "float")])
def test_a_bad_namespace_key_serde_is_a_config_error(key_serde, match) -> None:
    with pytest.raises(ConfigError, match=match):
        driver(opener(("a", key_serde)))


def test_a_serde_object_is_a_namespace_key_serde() -> None:
    with driver(opener(("a", IntSerde()))) as d:
        d.send("in", 42, 1.0, timestamp=0.0)
        with pytest.raises(InvalidValueError):
            d.send("in", "x", 1.0, timestamp=0.0)
        d.advance_event_time(5.0)
        assert d.outputs("fired", pending=True) == [(42, 1.0)]


def test_opening_a_namespace_without_timers_kept_names_what_to_add() -> None:
    with pytest.raises(ConfigError) as caught:
        TaskTestDriver(opener(("a",)), time={})
    assert caught.value.problems[0].path == "time.timers"


def test_a_due_timer_of_a_namespace_nobody_opened_stops_the_firing_and_stays_stored(tmp_path) -> None:
    """A stored timer of a namespace the task no longer opens: a ConfigError naming it, before any
    timer of its chunk is deleted; once the namespace is opened again it fires."""
    with TaskTestDriver(opener(("gone",)), time=TIMERS, state_dir=tmp_path) as d:
        d.send("in", "k", 5.0, timestamp=0.0)
        d.commit()
    with TaskTestDriver(opener(("other",)), time=TIMERS, state_dir=tmp_path) as d:
        with pytest.raises(ConfigError) as caught:
            d.advance_event_time(10.0)
        assert "'gone'" in str(caught.value) and "on_fire that does nothing" in caught.value.hint
        assert len(list(d.store(TIMER_STORE).all())) == 1
        d.crash()
    with TaskTestDriver(opener(("gone",)), time=TIMERS, state_dir=tmp_path) as d:
        d.advance_event_time(10.0)
        d.commit()
        assert d.outputs("fired") == [("k", 5.0)]


class FailingFire(Opener):
    def fired(self, key, timestamp, collector, coordinator):
        raise RuntimeError("boom")


def test_an_on_fire_failure_is_a_task_error_naming_the_namespace() -> None:
    with driver(FailingFire) as d:
        d.send("in", "k", 1.0, timestamp=0.0)
        with pytest.raises(TaskError) as caught:
            d.advance_event_time(5.0)
        assert "namespace 'a'" in str(caught.value) and "'k'" in caught.value.hint
        d.crash()


def test_the_guides_idle_users_task() -> None:
    """docs/time/index.md, "Timer namespaces": docs/snippets/time/idle_users.py."""
    snippet = Path(__file__).resolve().parents[2] / "docs" / "snippets" / "time" / "idle_users.py"
    task = runpy.run_path(str(snippet))["IdleUsers"]
    stores = {"last_click": {"engine": "kv", "key_serde": "string", "value_serde": "json"}}
    with TaskTestDriver(task, stores=stores, time={"timers": True}) as d:
        d.send("clicks", "ann", {}, timestamp=1_000.0)
        d.send("clicks", "bob", {}, timestamp=1_500.0)
        d.send("clicks", "ann", {}, timestamp=2_000.0)         # ann's idle time moves to 5600
        d.advance_event_time(5_100.0)                          # bob idle at 5100
        d.advance_event_time(6_000.0)
        d.commit()
        assert d.outputs("idle") == [("bob", 5_100.0), ("ann", 5_600.0)]
        assert list(d.store("last_click").all()) == []


def test_an_entry_splits_into_domain_timestamp_namespace_and_key() -> None:
    with driver() as d:
        d.send("in", "k", ["", "register", "event", 2.5], timestamp=0.0)
        d.send("in", 3, ["ints", "register", "processing", 5.0], timestamp=0.0)
        d.send("in", {"a": [1]}, ["json", "register", "event", 2.5], timestamp=0.0)
        with d.store(TIMER_STORE).all() as entries:
            split = [split_entry(entry) for entry, _ in entries]
        d.crash()
    assert split == [("event", 2.5, "", b'"k"'), ("event", 2.5, "json", b'{"a":[1]}'),
                     ("processing", 5.0, "ints", IntSerde().serialize(3))]
