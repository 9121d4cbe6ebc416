"""Engine, window-aggregation and serde combinations a store cannot use are refused before any record
(issue #48), and the refusals are generated from declarations (``StorageEngineFactory.serdes``,
``Aggregation.needs``, ``Serde.holds`` / ``keeps_prefixes``), never a list in the validator.

What this proves, for every built-in engine (and kind), window aggregation and built-in serde:

* an engine role declared unused really is unused: a serde that fails on every call goes through a
  workload of the engine untouched, and setting that serde in a job is refused;
* a window aggregation's declared needs are its real needs: every combination validation accepts
  runs exactly as the reference model, and every combination it refuses fails (or silently loses
  windows, the worst case: a ``json`` key serde's prefix scans find nothing) when forced to run;
* ``localstate validate`` refuses the windows a task's source spells out with the same problems the
  operator raises when ``init()`` builds them.
"""

from __future__ import annotations

import itertools
import re
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from localstate.core.config import parse_job_config
from localstate.core.engine import StoreContext
from localstate.core.registry import BUILTIN_DISTRIBUTION, Registry
from localstate.core.serdes import Serde
from localstate.errors import ConfigError, LocalStateError
from localstate.testing.driver import TaskTestDriver
from localstate.windows import (Session, Tumbling, count, distinct_count, quantiles, sum_of,
                                top_n)
from localstate.windows.reference import reference_windows, watermarks

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_store_aggregations import task_for  # noqa: E402 - the windowed task those tests run

REGISTRY = Registry()
SERDES = sorted(info.name for info in REGISTRY.available("serdes") if info.distribution == BUILTIN_DISTRIBUTION)
ENGINES = {"kv": [{}], "heap": [{"kind": "topn"}, {"kind": "reorder"}],
           "sketch": [{"kind": "hll"}, {"kind": "bloom"}, {"kind": "quantiles"}],
           "search": [{"fields": {"title": {"type": "text"}}}]}
BASE = 1_700_000_000.0


def test_the_lists_cover_every_builtin() -> None:
    builtins = {info.name for info in REGISTRY.available("engines") if info.distribution == BUILTIN_DISTRIBUTION}
    assert set(ENGINES) == builtins and set(SERDES) == {"bytes", "string", "int", "json", "pickle"}
    for engine, variants in ENGINES.items():
        kinds = REGISTRY.engine_factory(engine).options.get("kind")
        if kinds is not None and kinds.choices:
            assert {v["kind"] for v in variants} == set(kinds.choices), engine


def _problems(store: dict[str, Any]) -> dict[str, str]:
    try:
        parse_job_config({"job": {"name": "j", "task": "a:B", "allow_pickle": True}, "stores": {"s": store}})
    except ConfigError as exc:
        return {p.path: p.message for p in exc.problems}
    return {}


@pytest.mark.parametrize(("engine", "options"), [(e, o) for e, variants in ENGINES.items() for o in variants],
                         ids=lambda v: v if isinstance(v, str) else v.get("kind", ""))
def test_validation_follows_each_engines_declaration(engine: str, options: dict) -> None:
    factory = REGISTRY.engine_factory(engine)
    uses = factory.serdes(factory.validate_options("s", dict(options)))
    for (role, use), serde in itertools.product((("key", uses.key), ("value", uses.value)), SERDES):
        found = _problems({"engine": engine, **options, f"{role}_serde": serde})
        if use is None:
            assert list(found) == [f"stores.s.{role}_serde"], (engine, options, role, serde)
            assert f"has no {role} serde" in found[f"stores.s.{role}_serde"]
        else:
            expected = use.problem(REGISTRY.serde(serde, allow_pickle=True))
            assert (f"stores.s.{role}_serde" in found) == (expected is not None), (engine, options, role, serde)
    # Unset, an unused serde is no problem (the default is not the user's choice).
    assert _problems({"engine": engine, **options}) == {}


class Untouchable(Serde[Any]):
    """A serde no call may reach: what an engine that declares a role unused is given for it."""

    name = "untouchable"
    holds = (object,)

    def serialize(self, obj: Any) -> bytes:
        raise AssertionError(f"the engine used its unused serde: serialize({obj!r})")

    def deserialize(self, data: bytes) -> Any:
        raise AssertionError(f"the engine used its unused serde: deserialize({data!r})")


def _workload(engine: str, kind: str | None, store: Any, attempt: int) -> None:
    """What a task does with such a store: every write and read of its typed API."""
    if engine == "sketch":
        item = 1.5 if kind == "quantiles" else "x"
        store.add("a", item)
        store.add("b", item)
        store.merge("a", "b")
        if kind == "bloom":
            assert store.contains("a", "x")
        elif kind == "hll":
            assert store.count("a") >= 1
        else:
            assert list(store.quantiles("a", [0.5])) == [1.5]
        assert sorted(store.names()) == ["a", "b"]
    elif engine == "search":
        store.add("doc-1", {"title": "hello world"})
        store.add("doc-2", {"title": "bye"})
        store.delete("doc-2")
        store.flush()  # a search sees what was flushed
        assert [hit.doc_id for hit in store.search("hello")] == ["doc-1"]
    else:  # the reorder buffer
        start = 10.0 * attempt  # after the watermark the last attempt left
        store.push({"e": 3}, start + 3.0)
        store.push({"e": 1}, start + 1.0)
        # the event restored from the last attempt (at 3.0) comes out too, in timestamp order
        expected = [{"e": 3}, {"e": 1}] if attempt else [{"e": 1}]
        assert [event.event for event in store.drain_until(start + 2.0)] == expected


@pytest.mark.parametrize(("engine", "options", "role"), [
    ("sketch", {"kind": "hll"}, "value"), ("sketch", {"kind": "bloom"}, "value"),
    ("sketch", {"kind": "quantiles"}, "value"), ("search", {"fields": {"title": {"type": "text"}}}, "value"),
    ("heap", {"kind": "reorder"}, "key"),
], ids=["hll", "bloom", "quantiles", "search", "reorder"])
def test_a_role_declared_unused_is_never_called(engine: str, options: dict, role: str, tmp_path: Path) -> None:
    from localstate.changelog.memory import MemoryChangelogPartition
    from localstate.core.serdes import JsonSerde, StringSerde

    factory = REGISTRY.engine_factory(engine)
    validated = factory.validate_options("s", {**options, **({} if engine == "search" else {"backend": "memory"})})
    assert getattr(factory.serdes(validated), role) is None  # the declaration under test
    used = JsonSerde() if engine == "heap" else StringSerde()
    serdes = {"key_serde": Untouchable(), "value_serde": used} if role == "key" else \
        {"key_serde": used, "value_serde": Untouchable()}
    changelog = MemoryChangelogPartition()
    for attempt in range(2):  # write, flush; then reopen from the changelog and write again
        context = StoreContext(job="j", store="s", partition=0, directory=tmp_path / str(attempt), options=validated,
                               changelog=changelog, **serdes)
        (tmp_path / str(attempt)).mkdir()
        store = factory.create(context)
        try:
            store.restore(changelog.read(0))
            _workload(engine, validated.get("kind"), store, attempt)
            store.flush()
        finally:
            store.close()


# -- window aggregations ------------------------------------------------------------------------------

AGGREGATIONS = {  # name -> (aggregation, its store's engine table)
    "count": (count(), {"engine": "kv"}),
    "sum_of": (sum_of(lambda v: v["n"]), {"engine": "kv"}),
    "distinct_count": (distinct_count(lambda v: v["u"]), {"engine": "sketch", "kind": "hll"}),
    "quantiles": (quantiles([0.5], lambda v: v["n"]), {"engine": "sketch", "kind": "quantiles"}),
    "top_n": (top_n(2, lambda v: v["u"]), {"engine": "heap", "kind": "topn"}),
}
WINDOWS = {"tumbling": Tumbling(60), "session": Session(20)}
STREAM = [(f"k{i % 3}", {"n": i % 7, "u": f"u{i % 5}"}, BASE + i * 7.0) for i in range(40)]
# The sketch engine also takes str names under the bytes serde (its default key serde), and a
# session window never reads its names back: that one refused combination happens to run.
LENIENT = {("distinct_count", "session", "bytes"), ("quantiles", "session", "bytes")}


def _job(tmp_path: Path, store: dict[str, Any]) -> Any:
    return parse_job_config({
        "job": {"name": "w", "partitions": 1, "task": "unused:Unused", "state_dir": str(tmp_path),
                "commit_interval": 10 ** 9, "changelog": "memory", "allow_pickle": True},
        "time": {"timers": True, "timer_backend": "memory"}, "changelogs": {"memory": {}},
        "stores": {"s": {**store, "backend": "memory"},
                   "index": {"engine": "kv", "backend": "memory", "key_serde": "string", "value_serde": "json"}},
    }, base_dir=tmp_path)


def _outcome(tmp_path: Path, name: str, window: Any, store: dict[str, Any]) -> str:
    """``refused`` (a ConfigError when init() builds the window), ``exact``, or ``fails``."""
    aggregate = AGGREGATIONS[name][0]
    job = _job(tmp_path, store)
    try:
        with TaskTestDriver(task_for(window, aggregate, "s"), job=job) as driver:
            for key, value, ts in STREAM:
                driver.send("events", key, value, timestamp=ts)
            driver.commit()
            sent = {(k, v["start"], v["end"]): v["value"] for k, v in driver.outputs("out")}
    except ConfigError:
        return "refused"
    except LocalStateError:
        return "fails"
    marks = watermarks([ts for *_, ts in STREAM])
    expected = reference_windows([(k, v, ts, w) for (k, v, ts), w in zip(STREAM, marks)], window, aggregate)
    reference = {(k, w.start, w.end): value for k, w, value in expected.outputs}
    if name == "distinct_count":  # an estimate: exact here (few items), but compare the windows only
        return "exact" if sent and sent.keys() == reference.keys() else "fails"
    return "exact" if sent and sent == reference else "fails"


def _cases() -> list[tuple[str, str, str, str]]:
    cases = [(name, window, key, "natural") for name in AGGREGATIONS for window in WINDOWS for key in SERDES]
    cases += [("count", window, "string", value) for window in WINDOWS for value in SERDES]  # a count's int
    return cases


@pytest.mark.parametrize(("name", "window", "key_serde", "value_serde"), _cases())
def test_a_window_aggregation_runs_exactly_where_validation_accepts_it(
        name: str, window: str, key_serde: str, value_serde: str, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    store = {**AGGREGATIONS[name][1], "key_serde": key_serde}
    if store["engine"] == "kv":
        store["value_serde"] = "int" if value_serde == "natural" else value_serde
    verdict = _outcome(tmp_path / "checked", name, WINDOWS[window], store)
    # The same combination with the operator's check switched off: what it would do at run time.
    import localstate.windows.operator as operator

    monkeypatch.setattr(operator, "check_stores", lambda use, job: None)
    forced = _outcome(tmp_path / "forced", name, WINDOWS[window], store)
    if verdict == "refused":
        assert forced == "fails" or (name, window, key_serde) in LENIENT, (name, window, store, forced)
    else:
        assert verdict == forced == "exact", (name, window, store, verdict, forced)


def test_string_keys_suit_every_window_aggregation(tmp_path: Path) -> None:
    """What the guide says (docs/time/windows.md): ``key_serde = "string"`` for every window store."""
    for (name, (_, table)), (label, window) in itertools.product(AGGREGATIONS.items(), WINDOWS.items()):
        store = {**table, "key_serde": "string", **({"value_serde": "int"} if table["engine"] == "kv" else {})}
        assert _outcome(tmp_path / f"{name}-{label}", name, window, store) == "exact", (name, label)


TASK_MODULE = '''
from localstate import StreamTask
from localstate.windows import Session, Tumbling, WindowedAggregation, count, top_n


class Stats(StreamTask):
    def init(self, context):
        self.views = WindowedAggregation(context, Tumbling("1m"), count(), store="views", output="out")
        self.pages = WindowedAggregation(context, Session("5m"), top_n(3), store="pages", output="out",
                                         index_store="sessions")

    def process(self, envelope, collector, coordinator):
        self.views.add(envelope.key, envelope.value, envelope.timestamp, collector)
        self.pages.add(envelope.key, envelope.value, envelope.timestamp, collector)

    def on_timer(self, key, timestamp, collector, coordinator):
        self.views.on_timer(key, timestamp, collector) or self.pages.on_timer(key, timestamp, collector)
'''

BAD_STORES = """
[stores.views]
engine = "kv"
key_serde = "json"
value_serde = "string"

[stores.pages]
engine = "heap"
kind = "topn"

[stores.sessions]
engine = "kv"
key_serde = "string"
value_serde = "int"
"""


def test_validate_refuses_the_windows_a_task_spells_out_as_init_would(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from localstate.tools.validation import check_job

    (tmp_path / "window_stats_task.py").write_text(TASK_MODULE)
    (tmp_path / "in").mkdir()
    job_file = tmp_path / "job.toml"
    job_file.write_text(textwrap.dedent("""
        [job]
        name = "stats"
        task = "window_stats_task:Stats"
        [inputs.events]
        system = "jsonl"
        path = "in"
        [outputs.out]
        system = "jsonl"
        path = "out"
        [time]
        timers = true
        """) + BAD_STORES)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "window_stats_task", raising=False)
    at_validate = {p.path: p.message for p in check_job(job_file).problems}
    assert set(at_validate) == {"stores.views.key_serde", "stores.views.value_serde", "stores.pages.key_serde",
                                "stores.sessions.value_serde"}
    assert "window_stats_task.py:" in at_validate["stores.views.key_serde"]  # where the window is built
    assert "read back by prefix" in at_validate["stores.views.key_serde"]

    # init() refuses the same stores with the same words (less the source line)
    from localstate.core.config import load_job_config

    job = load_job_config(job_file)
    task = sys.modules["window_stats_task"].Stats
    with pytest.raises(ConfigError) as caught:
        with TaskTestDriver(task, job=job) as driver:
            driver.send("events", "k", {}, timestamp=BASE)
    at_init = {p.path: p.message for p in caught.value.problems}
    assert at_init and set(at_init) <= set(at_validate)
    for path, message in at_init.items():
        assert re.sub(r" \(window_stats_task\.py:\d+\)", "", at_validate[path]) == message
