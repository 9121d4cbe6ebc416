"""One validation (issue #48): ``localstate run`` checks everything ``localstate validate`` does before
it starts Spark, and reports the same problems in the same words, all at once. A task module that
fails to import shows the user's frames only, in both. Did-you-mean suggests an engine's own options
first.

The corpus is generated: hypothesis combines defects of a catalog (a missing input folder, a task
that fails to import, an unknown option, a serde the store cannot use, a window store of the wrong
serde, ...) into one job file, and both commands run on it in this process. None of them starts
Spark: every job has at least one problem, and ``run`` stops at its validation.
"""

from __future__ import annotations

import itertools
import re
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from localstate.core.config import parse_job_config
from localstate.core.options import live_options
from localstate.core.registry import BUILTIN_DISTRIBUTION, Registry
from localstate.errors import ConfigError
from localstate.tools.cli import main

TASK = '''
from localstate import StreamTask
from localstate.windows import Tumbling, WindowedAggregation, count


class Counter(StreamTask):
    def init(self, context):
        self.views = WindowedAggregation(context, Tumbling("1m"), count(), store="views", output="out")

    def process(self, envelope, collector, coordinator):
        self.views.add(envelope.key, envelope.value, envelope.timestamp, collector)

    def on_timer(self, key, timestamp, collector, coordinator):
        self.views.on_timer(key, timestamp, collector)
'''

BASE = {
    "job": {"name": "counter", "partitions": 2, "task": "{module}:Counter", "state_dir": "state"},
    "inputs": {"events": {"system": "jsonl", "path": "in"}},
    "outputs": {"out": {"system": "jsonl", "path": "out"}},
    "stores": {"views": {"engine": "kv", "key_serde": "string", "value_serde": "int"},
               "top": {"engine": "heap", "key_serde": "string", "capacity": 3},
               "uniq": {"engine": "sketch", "kind": "hll", "key_serde": "string"}},
    "time": {"timers": True},
}

Job = dict[str, Any]


def _set(section: str, name: str, key: str, value: Any) -> Callable[[Job], None]:
    def apply(job: Job) -> None:
        job[section][name][key] = value
    return apply


def _drop(section: str, name: str, key: str) -> Callable[[Job], None]:
    def apply(job: Job) -> None:
        job[section][name].pop(key)
    return apply


#: name -> (what it does to the job, what to the folder, the config paths it must be reported at)
DEFECTS: dict[str, tuple[Callable[[Job], None] | None, str | None, set[str]]] = {
    "missing input folder": (None, "no-input", {"inputs.events.path"}),
    "task raises at import": (None, "raising-task", {"job.task"}),
    "task has a syntax error": (None, "syntax-task", {"job.task"}),
    "mistyped heap size": (lambda job: job["stores"]["top"].update({"size": 3}), None, {"stores.top.size"}),
    "sketch with a value serde": (_set("stores", "uniq", "value_serde", "json"), None, {"stores.uniq.value_serde"}),
    "window store keyed by json": (_set("stores", "views", "key_serde", "json"), None, {"stores.views.key_serde"}),
    "window count as text": (_set("stores", "views", "value_serde", "string"), None, {"stores.views.value_serde"}),
    "unknown serde": (_set("stores", "top", "value_serde", "yaml"), None, {"stores.top.value_serde"}),
    "pickle not allowed": (_set("stores", "top", "value_serde", "pickle"), None, {"stores.top.value_serde"}),
    "unknown engine": (_set("stores", "uniq", "engine", "hyperloglog"), None, {"stores.uniq.engine"}),
    "unknown job key": (lambda job: job["job"].update({"paritions": 4}), None, {"job.paritions"}),
    "output over the input": (_set("outputs", "out", "path", "in"), None, {"outputs.out"}),
    "input without a system": (_drop("inputs", "events", "system"), None, {"inputs.events.system"}),
    "bad partitions": (lambda job: job["job"].update({"partitions": 0}), None, {"job.partitions"}),
}
_TASK_DEFECTS = {"task raises at import", "task has a syntax error"}
#: What a defect keeps validation from seeing: a check needs what the defect broke.
HIDES = {
    "task raises at import": {"stores.views.key_serde", "stores.views.value_serde"},  # the windows are in the task
    "task has a syntax error": {"stores.views.key_serde", "stores.views.value_serde"},
    "input without a system": {"inputs.events.path", "outputs.out"},  # no input to look at
    "unknown engine": {"stores.uniq.value_serde"},  # no engine to declare its serdes
}
_modules = itertools.count()


def _write(folder: Path, defects: list[str]) -> tuple[Path, str]:
    """The job with ``defects`` in ``folder``; its task module's (unique) name."""
    import copy

    from test_code_blocks import dump_toml  # tests/docs: the TOML writer for job files

    module = f"one_validation_task_{next(_modules)}"
    job = copy.deepcopy(BASE)
    job["job"]["task"] = job["job"]["task"].format(module=module)
    source = TASK
    for name in defects:
        change, folder_change, _ = DEFECTS[name]
        if change is not None:
            change(job)
        if folder_change == "raising-task":
            source = "import json\n\njson.loads('{not json')\n" + TASK
        elif folder_change == "syntax-task":
            source = TASK.replace("def process(self, envelope,", "def process(self, envelope,,")
    if "missing input folder" not in defects:
        (folder / "in").mkdir()
    (folder / f"{module}.py").write_text(source)
    job_file = folder / "job.toml"
    job_file.write_text(dump_toml(job))
    return job_file, module


def _errors(command: str, job_file: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    saved_path, saved_modules = list(sys.path), set(sys.modules)
    try:
        code = main([command, str(job_file)])
    finally:
        sys.path[:] = saved_path
        for name in set(sys.modules) - saved_modules:
            if name.startswith("one_validation_task_"):
                del sys.modules[name]
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(autouse=True)
def _docs_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "docs"))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(defects=st.lists(st.sampled_from(sorted(DEFECTS)), min_size=1, max_size=5, unique=True)
       .filter(lambda chosen: len(_TASK_DEFECTS & set(chosen)) <= 1))
def test_run_and_validate_report_the_same_problems(defects: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        job_file, _module = _write(Path(tmp), defects)
        code, out, validated = _errors("validate", job_file, capsys)
        assert code == 1 and out == "", validated
        code, out, ran = _errors("run", job_file, capsys)
        assert code == 1, ran
        assert out == ""  # not even the "job ...: N partition(s) on ..." line: Spark never started
    assert ran.replace("localstate run: error:", "localstate validate: error:", 1) == validated
    reported = set(re.findall(r"^  - ([\w.-]+):", validated, re.MULTILINE))
    expected = set().union(*(DEFECTS[name][2] for name in defects))
    expected -= set().union(*(HIDES.get(name, set()) for name in defects))
    assert expected <= reported, (defects, validated)
    assert "<frozen" not in validated  # the user's frames only (the import machinery's: with -v)
    if "task has a syntax error" in defects:
        assert "def process(self, envelope,," in validated and "^" in validated


def test_a_syntax_error_in_the_task_is_shown_as_python_shows_it(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    job_file, module = _write(tmp_path, ["task has a syntax error"])
    code, _, err = _errors("validate", job_file, capsys)
    assert code == 1
    summary = err.split("what to do:", 1)[1]
    assert f'in your code:\n  File "{tmp_path / module}.py", line ' in summary
    assert "SyntaxError: " in summary and "<frozen" not in summary and "importlib" not in summary
    assert f"at {tmp_path / module}.py:" in err.splitlines()[1]  # the problem names the file and line
    assert main(["-v", "validate", str(job_file)]) == 1
    assert "full traceback:" in capsys.readouterr().err  # the import machinery's frames: there, with -v
    sys.modules.pop(module, None)


def test_a_task_module_that_does_not_exist_shows_no_import_machinery(tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    job_file, module = _write(tmp_path, [])
    (tmp_path / f"{module}.py").unlink()
    code, _, err = _errors("validate", job_file, capsys)
    assert code == 1 and f"No module named '{module}'" in err
    assert "<frozen" not in err and "File " not in err


# -- did you mean -------------------------------------------------------------------------------------

def _suggestion(engine: str, options: dict, key: str) -> str | None:
    try:
        parse_job_config({"job": {"name": "j", "task": "a:B"}, "stores": {"s": {"engine": engine, **options, key: 1}}})
    except ConfigError as exc:
        for problem in exc.problems:
            if problem.path == f"stores.s.{key}":
                found = re.search(r"did you mean '([^']+)'", problem.message)
                return found.group(1) if found else None
    return None


@pytest.mark.parametrize(("engine", "options", "typed", "meant"), [
    ("heap", {}, "size", "capacity"),             # not LMDB's map_size
    ("heap", {}, "max_size", "capacity"),
    ("heap", {}, "capasity", "capacity"),
    ("sketch", {"kind": "bloom"}, "size", "capacity"),
    ("sketch", {"kind": "hll"}, "presicion", "precision"),
    ("kv", {}, "size", "cache_size"),
    ("kv", {}, "expire_after", "ttl"),
    ("kv", {}, "blockcache", "block_cache_size"),  # a shared option still wins when it is clearly closer
    ("heap", {}, "map_sise", "map_size"),
    ("kv", {}, "compresion", "compression"),
])
def test_did_you_mean_prefers_the_engines_own_options(engine: str, options: dict, typed: str, meant: str) -> None:
    assert _suggestion(engine, options, typed) == meant


def _own_options() -> list[tuple[str, str]]:
    registry = Registry()
    found = []
    for info in registry.available("engines"):
        if info.distribution != BUILTIN_DISTRIBUTION:
            continue
        spec = live_options(registry.engine_factory(info.name).options)
        found += [(info.name, name) for name, option in spec.items() if not option.shared and len(name) >= 5]
    return found


@settings(max_examples=80, deadline=None)
@given(st.sampled_from(_own_options()), st.data())
def test_a_typo_of_an_engines_own_option_suggests_an_option_of_that_engine(case: tuple[str, str],
                                                                           data: st.DataObject) -> None:
    engine, name = case
    position = data.draw(st.integers(0, len(name) - 1))
    typo = data.draw(st.sampled_from([name[:position] + name[position + 1:],             # a letter dropped
                                      name[:position] + name[position] + name[position:],  # doubled
                                      name[:position] + "x" + name[position + 1:]]))      # replaced
    factory = Registry().engine_factory(engine)
    if typo in factory.options:  # a removed option's name too
        return
    from localstate.core.options import suggest_option

    suggested = re.search(r"'([^']+)'", suggest_option(typo, factory.options))
    assert suggested is not None, (engine, typo)
    assert not live_options(factory.options)[suggested.group(1)].shared, (engine, typo, suggested.group(1))


def test_every_shared_option_is_a_backend_option() -> None:
    from localstate.engines.backends.options import BACKEND_OPTIONS

    registry = Registry()
    for engine in ("kv", "heap", "sketch"):
        shared = {name for name, option in live_options(registry.engine_factory(engine).options).items() if option.shared}
        assert shared == set(BACKEND_OPTIONS), engine


def test_the_job_file_of_the_corpus_is_valid_without_defects(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The base of the corpus passes: each problem above comes from its defect."""
    from localstate.tools.validation import check_job

    job_file, module = _write(tmp_path, [])
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        assert check_job(job_file).problems == []
    finally:
        sys.modules.pop(module, None)
