"""Every code block of the guides is code that is checked (issue #32).

The test walks every page of mkdocs.yml's ``nav`` and every fenced block in it:

* a ```python or ```toml block must be a pymdownx.snippets include (``--8<-- "file"``) of a file under
  ``docs/snippets/`` or ``examples/``, or be listed in :data:`ALLOWED` with its reason; and every file
  the guides include is checked here: run (:data:`RUN`), validated as a job (:data:`JOBS`,
  :data:`FRAGMENTS`), compiled (:data:`COMPILE`) or tested by another test (:data:`TESTED_ELSEWHERE`);
* a shell block (```bash, ```console) may only show ``localstate`` subcommands and flags the CLI
  parser (``tools/cli.py: build_parser()``) has, and ``python -m bench NAME`` benchmarks that exist;
* output samples, pictures and signatures are ```text; a fence without a language fails.

Nothing here starts Spark or a broker: a snippet that needs one is compiled, and each ``localstate``
name it uses is checked to exist, instead of being run (see :data:`COMPILE`).
"""

from __future__ import annotations

import argparse
import ast
import copy
import importlib
import os
import re
import runpy
import shlex
import shutil
import sys
import tomllib
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
SNIPPETS = DOCS / "snippets"

# -- the pages and their blocks ---------------------------------------------------------------------

# Blocks of these languages must be included from a checked file (or allowed below).
CODE_LANGUAGES = {"python", "toml"}
# Shell blocks: their `localstate` and `python -m bench` commands are checked against the code.
SHELL_LANGUAGES = {"bash", "console"}
# Anything else a page may use (output samples, pictures, signatures: not runnable).
OTHER_LANGUAGES = {"text", "ini", "yaml", "json"}  # ini, yaml, json: other tools' files (a systemd unit, a Kubernetes
# manifest, a SeaweedFS identities file)

#: ``(page, first line of the block)`` -> why a python/toml block is neither included nor checked.
#: Keep it short: the way out of this list is a file under docs/snippets/ and a check below.
ALLOWED: dict[tuple[str, str], str] = {}

_FENCE = re.compile(r"^(?P<indent> *)(?P<fence>```+|~~~+)(?P<info>[^`]*)$")
_INCLUDE = re.compile(r'^\s*--8<-- "(?P<path>[^":]+)(?::(?P<section>[\w-]+))?"\s*$')


def nav_pages() -> list[str]:
    """The Markdown files of mkdocs.yml's nav that exist in docs/ (the generated references do not)."""
    config = yaml.load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"), Loader=yaml.BaseLoader)

    def walk(node: Any) -> Iterator[str]:
        if isinstance(node, str):
            yield node
        elif isinstance(node, list):
            for item in node:
                yield from walk(item)
        elif isinstance(node, dict):
            for value in node.values():
                yield from walk(value)

    return [page for page in walk(config["nav"]) if page.endswith(".md") and (DOCS / page).is_file()]


def blocks(page: str) -> list[tuple[int, str, list[str]]]:
    """``(line, language, body lines)`` of every fenced block of ``page``."""
    found, opened = [], None
    for number, line in enumerate((DOCS / page).read_text(encoding="utf-8").splitlines(), 1):
        match = _FENCE.match(line)
        if opened is None:
            if match:
                opened = (number, match["fence"], match["info"].strip().split(" ")[0], [])
        elif match and match["fence"] == opened[1] and not match["info"].strip():
            found.append((opened[0], opened[2], opened[3]))
            opened = None
        else:
            opened[3].append(line)
    assert opened is None, f"{page}:{opened[0]}: unclosed code block"
    return found


def all_blocks() -> list[tuple[str, int, str, list[str]]]:
    return [(page, line, language, body) for page in nav_pages() for line, language, body in blocks(page)]


def included_file(path: str) -> Path | None:
    """Where pymdownx.snippets finds ``path`` (mkdocs.yml: base_path [docs/snippets, .])."""
    for base in (SNIPPETS, ROOT):
        if (base / path).is_file():
            return base / path
    return None


def includes() -> dict[str, list[str]]:
    """Every file the nav's pages include -> the ``page:line`` places that include it."""
    found: dict[str, list[str]] = {}
    for page, line, _language, body in all_blocks():
        for text in body:
            match = _INCLUDE.match(text)
            if match:
                found.setdefault(match["path"], []).append(f"{page}:{line}")
    return found


def test_the_nav_has_the_guides() -> None:
    pages = nav_pages()
    assert {"first-task.md", "task-api.md", "kv.md", "plugins.md", "spark-users.md"} <= set(pages)
    assert sum(len(blocks(page)) for page in pages) > 50


def test_every_block_has_a_known_language() -> None:
    bad = [f"{page}:{line}: ```{language or '(none)'}" for page, line, language, _ in all_blocks()
           if language not in CODE_LANGUAGES | SHELL_LANGUAGES | OTHER_LANGUAGES]
    assert not bad, "mark output samples, pictures and signatures as ```text:\n" + "\n".join(bad)


def test_python_and_toml_blocks_are_included_from_checked_files() -> None:
    bad, used = [], set()
    for page, line, language, body in all_blocks():
        if language not in CODE_LANGUAGES:
            continue
        key = (page, body[0].strip() if body else "")
        if key in ALLOWED:
            used.add(key)
            continue
        code = [text for text in body if text.strip()]
        match = _INCLUDE.match(code[0]) if len(code) == 1 else None
        if match is None:
            bad.append(f"{page}:{line}: a ```{language} block written inline (put it in docs/snippets/ and "
                       "include it with --8<--)")
        elif included_file(match["path"]) is None:
            bad.append(f"{page}:{line}: includes {match['path']}, which does not exist")
    assert not bad, "\n".join(bad)
    assert used == set(ALLOWED), f"stale ALLOWED entries: {set(ALLOWED) - used}"


def test_every_included_file_is_checked() -> None:
    checked = set(RUN) | set(JOBS) | set(FRAGMENTS) | set(COMPILE) | set(TESTED_ELSEWHERE)
    unchecked = {path: places for path, places in includes().items() if path not in checked}
    assert not unchecked, f"included but checked by no test (add it to a table of this module): {unchecked}"
    assert not checked - set(includes()), f"checked but included nowhere: {checked - set(includes())}"


# -- Python: run, or compile where it needs Spark or a broker ----------------------------------------

def run_script(path: str, cwd: Path, capsys: pytest.CaptureFixture[str]) -> str:
    """Run the snippet as ``__main__`` in ``cwd`` (its temporary files land there); its printed output."""
    previous = Path.cwd()
    os.chdir(cwd)
    try:
        runpy.run_path(str(included_file(path)), run_name="__main__")
    finally:
        os.chdir(previous)
    return capsys.readouterr().out


def check_changelog(out: str) -> None:
    assert out.rstrip().endswith("3 -> 2"), out


def check_kv(out: str) -> None:
    lines = out.splitlines()
    assert lines[0] == "3 5" and lines[1] == "[('bat', 1)]", out
    assert lines[2] == "[('and', 2), ('bat', 1), ('cat', 1), ('hat', 1)]" and lines[3] == "['the', 'hat']", out


def check_ttl(out: str) -> None:
    assert out.splitlines() == ["{'pages': 3}", "None [('bob', {'pages': 1})]", "[(b'ann', None)]"], out


def check_heap(out: str) -> None:
    assert out.splitlines()[0] == "[('/a', 40.0), ('/b', 30.0)]", out


#: Self-contained scripts, run in a temporary directory; the function checks what they print (the
#: values their comments promise).
RUN = {
    "changelog/file_changelog.py": check_changelog,
    "kv/engine_direct.py": check_kv,
    "heap/topn_direct.py": check_heap,
    "time/ttl_direct.py": check_ttl,
    # not scripts: the tests named after them below use them
    "plugins/acme_dict/__init__.py": None,
    "plugins/sized_dict.py": None,
    "task_api/typed_stores.py": None,
    "task_api/batch_task.py": None,
    "time/sessions.py": None,
    "time/test_sessions.py": None,
}


@pytest.mark.parametrize("path", sorted(p for p, check in RUN.items() if check is not None))
def test_script_runs(path: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    RUN[path](run_script(path, tmp_path, capsys))


def _store_context(factory: Any, options: dict, directory: Path, changelog: Any) -> Any:
    from localstate.core.engine import StoreContext
    from localstate.core.serdes import JsonSerde, StringSerde

    return StoreContext(job="docs", store="sessions", partition=0, directory=directory,
                        options=factory.validate_options("sessions", options), key_serde=StringSerde(),
                        value_serde=JsonSerde(), changelog=changelog)


def test_plugin_example_engine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/plugins.md: the acme-dict engine logs its writes and is rebuilt from its changelog; the
    options example reads ``initial_capacity``, defaulted and validated."""
    from localstate.changelog.memory import MemoryChangelogPartition

    monkeypatch.syspath_prepend(str(SNIPPETS / "plugins"))
    for name in ("acme_dict", "sized_dict"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    acme_dict = importlib.import_module("acme_dict")
    sized_dict = importlib.import_module("sized_dict")
    factory, changelog = acme_dict.DictEngineFactory(), MemoryChangelogPartition()

    engine = factory.create(_store_context(factory, {}, tmp_path, changelog))
    engine.put("ada", {"pages": 2})
    engine.flush()
    assert engine.local_offset() is None and changelog.end_offset() == 1
    engine.close()
    again = factory.create(_store_context(factory, {}, tmp_path, changelog))
    again.restore(changelog.read(0))
    assert again.get("ada") == {"pages": 2}

    assert sized_dict.SizedDictEngine(_store_context(factory, {}, tmp_path, changelog)).capacity == 0
    sized = sized_dict.SizedDictEngine(_store_context(factory, {"initial_capacity": 1024}, tmp_path, changelog))
    assert sized.capacity == 1024


def test_typed_store_access(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/task-api.md, "Typed access": ``context.kv`` and ``context.store(name, TopNEngine)``."""
    from localstate.testing.driver import TaskTestDriver

    task = runpy.run_path(str(SNIPPETS / "task_api" / "typed_stores.py"))["TrendingPages"]
    stores = {"counts": {"engine": "kv", "key_serde": "string", "value_serde": "int"},
              "trending": {"engine": "heap", "key_serde": "string", "order": "max", "capacity": 2}}
    with TaskTestDriver(task, stores=stores, state_dir=tmp_path) as driver:
        for page in ("/a", "/b", "/a", "/c", "/a", "/b"):
            driver.send("views", page, {})
        driver.commit()
        assert [(e.item, e.score) for e in driver.store("trending").top(2)] == [("/a", 3.0), ("/b", 2.0)]


def test_batch_task(tmp_path: Path) -> None:
    """docs/task-api.md, "Batch tasks": the batch task counts exactly as a per-record count would."""
    from localstate.testing.driver import TaskTestDriver

    task = runpy.run_path(str(SNIPPETS / "task_api" / "batch_task.py"))["CountPerUserBatch"]
    stores = {"counts": {"engine": "kv", "key_serde": "string", "value_serde": "int"}}
    users = ["ann", "bob", "ann", "cy", "ann", "bob"]
    with TaskTestDriver(task, stores=stores, state_dir=tmp_path) as driver:
        driver.send_batch("views", users, [{}] * len(users))
        driver.commit()
        assert {u: driver.store("counts").get(u) for u in set(users)} == {"ann": 3, "bob": 2, "cy": 1}
        assert driver.outputs("counts") == [("ann", 1), ("bob", 1), ("ann", 2), ("cy", 1), ("ann", 3), ("bob", 2)]


def test_time_guide_sessions(monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/time/index.md: the session task's own test, with its event-time timers, passes."""
    monkeypatch.syspath_prepend(str(SNIPPETS / "time"))
    for name in ("sessions", "test_sessions"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    tests = importlib.import_module("test_sessions")
    tests.test_a_session_ends_after_thirty_minutes_without_a_click()


def localstate_names(tree: ast.AST) -> Iterator[tuple[str, str | None]]:
    """``(module, attribute)`` of every ``from localstate... import x`` and ``localstate.a.b.x`` use."""
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "localstate":
            for alias in node.names:
                yield node.module, alias.name
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "localstate":
                    yield alias.name, None
        elif isinstance(node, ast.Attribute):
            parts, inner = [], node
            while isinstance(inner, ast.Attribute):
                parts.append(inner.attr)
                inner = inner.value
            if isinstance(inner, ast.Name) and inner.id == "localstate" and len(parts) >= 2:
                parts.reverse()
                yield "localstate." + ".".join(parts[:-1]), parts[-1]


#: Snippets that need a SparkSession or a Kafka broker: compiled, and every localstate module and
#: name they use must exist; not run (the tests stay fast and Spark-free). What they show runs in the
#: Spark and Kafka tests (tests/spark, tests/kafka) through the same entry points.
COMPILE = {
    "kafka/devbroker.py": "starts a Tansu broker",
    "kafka/spark_source.py": "needs a SparkSession (`spark`) and a broker",
    "spark/read_state.py": "needs a SparkSession (`spark`) and a job that ran",
    "spark_users/foreach_batch.py": "needs a streaming DataFrame (`events`)",
    "spark_users/partitioned.py": "needs a SparkSession (`spark`), a broker and a sink (`write`)",
    "spark_users/reader_options.py": "needs a SparkSession (`spark`) and a job that ran",
    "state_reader/register.py": "needs a SparkSession (`spark`) and a job that ran",
    "state_reader/read_state.py": "needs a SparkSession (`spark`) and a job (`job`) that ran",
    "state_reader/try_it.py": "starts Spark on the windowed_counts example's state",
    "operations/run_job.py": "runs under spark-submit on a cluster",
    "state_as_data/bootstrap.py": "needs a SparkSession (`spark`) and a table",
    "state_as_data/write_back.py": "needs a SparkSession (`spark`) and a savepoint",
}


@pytest.mark.parametrize("path", sorted(COMPILE))
def test_snippet_compiles_and_names_exist(path: str) -> None:
    source = included_file(path).read_text(encoding="utf-8")
    tree = ast.parse(source, filename=path)
    compile(tree, path, "exec")
    names = list(localstate_names(tree))
    assert names, f"{path} uses no localstate name: run it instead"
    for module_name, attribute in names:
        module = importlib.import_module(module_name)
        if attribute is not None and not hasattr(module, attribute):
            importlib.import_module(f"{module_name}.{attribute}")  # a submodule, or ModuleNotFoundError


#: Included files other tests run or validate: the file -> the test that does.
TESTED_ELSEWHERE = {
    "first_task/my_tasks.py": "tests/docs/test_site.py",
    "first_task/job.toml": "tests/docs/test_site.py",
    "first_task/test_my_tasks.py": "tests/docs/test_site.py",
    "spark_users/first_day.py": "tests/docs/test_spark_users_snippets.py",
    "examples/task_api/word_counts.py": "tests/core/test_task_api_example.py",
    "examples/task_api/test_word_counts.py": "tests/core/test_task_api_example.py",
    "contract/toy_engine.py": "tests/contract/test_contract_doc.py",  # passes the contract suite
    "contract/test_toy_contract.py": "tests/contract/test_contract_doc.py",
    "search/engine_direct.py": "tests/search/test_search_engine.py",
    "sketch/engine_direct.py": "tests/sketch/test_store.py",
    "examples/windowed_counts/windowed_counts.py": "tests/windows/test_examples.py",
    "time/page_stats.py": "tests/windows/test_docs_snippets.py",
    "time/idle_users.py": "tests/time/test_timer_namespaces.py",
    "state_as_data/read_with_pandas.py": "tests/spark/test_state_as_data_transcript.py",
    "state_as_data/migrate.py": "tests/statedata/test_migrations.py",
}


def test_the_other_tests_use_those_files() -> None:
    for path, test in TESTED_ELSEWHERE.items():
        text = (ROOT / test).read_text(encoding="utf-8")
        name = Path(path).name
        folder = Path(path).parent.name
        assert name in text or (folder in text and "SNIPPETS" in text), (path, test)


# -- TOML: whole jobs validate; fragments validate inside a whole job ---------------------------------

def check_job_file(job_file: Path) -> None:
    """``localstate validate`` in this process: no problem (notes are fine)."""
    from localstate.tools.validation import check_job

    data = tomllib.loads(job_file.read_text(encoding="utf-8"))
    for table in data.get("inputs", {}).values():  # the input files a job reads: there, as after make_input.py
        if isinstance(table.get("path"), str) and "://" not in table["path"]:
            (job_file.parent / table["path"]).mkdir(parents=True, exist_ok=True)
    # Another test may have imported a module of the same name (every first task is `my_tasks`):
    # set it aside, so the job's own module beside its file is the one validated.
    task_module = str(data.get("job", {}).get("task", "")).partition(":")[0]
    shadowed = sys.modules.pop(task_module, None) if task_module else None
    saved_path, saved_modules = list(sys.path), set(sys.modules)
    try:
        check = check_job(job_file)
    finally:
        sys.path[:] = saved_path
        for name in set(sys.modules) - saved_modules:  # the task module, imported from the job's folder
            module = sys.modules[name]
            if str(getattr(module, "__file__", "") or "").startswith(str(job_file.parent)):
                del sys.modules[name]
        if shadowed is not None:
            sys.modules[task_module] = shadowed
    assert not check.problems, "\n".join(f"{p.path}: {p.message}" for p in check.problems)


def copy_job(job: Path, task_module: Path, folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copy(task_module, folder / task_module.name)
    return Path(shutil.copy(job, folder / "job.toml"))


WINDOWED = ROOT / "examples" / "windowed_counts"
FIRST = SNIPPETS / "first_task"

#: Whole job files: the job file -> its task module, copied beside it.
JOBS = {
    "spark/job.toml": WINDOWED / "windowed_counts.py",
    "examples/task_api/job.toml": ROOT / "examples" / "task_api" / "word_counts.py",
    "examples/windowed_counts/job.toml": WINDOWED / "windowed_counts.py",
    "time/page_stats.toml": SNIPPETS / "time" / "page_stats.py",
    "state_as_data/job.toml": SNIPPETS / "state_as_data" / "clicks.py",
}


@pytest.mark.parametrize("path", sorted(JOBS))
def test_job_file_validates(path: str, tmp_path: Path) -> None:
    check_job_file(copy_job(included_file(path), JOBS[path], tmp_path / "job"))


_PLAIN_TABLES = ("job", "spark", "time")  # tables of values; the others are tables of named tables


def merge(base: dict, fragment: dict) -> dict:
    """``fragment`` over ``base``: keys of [job] and [spark] one by one, named tables
    ([stores.x], [inputs.x], [changelogs.x], ...) whole."""
    merged = copy.deepcopy(base)
    for section, table in fragment.items():
        if section in _PLAIN_TABLES:
            merged.setdefault(section, {}).update(table)
        else:
            merged.setdefault(section, {}).update(copy.deepcopy(table))
    return merged


def dump_toml(data: dict) -> str:
    """Enough of a TOML writer for job files: [section] and [section.name] tables of plain values."""

    def value(v: Any) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, (int, float)):
            return repr(v)
        if isinstance(v, str):
            return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
        if isinstance(v, list):
            return "[" + ", ".join(value(x) for x in v) + "]"
        if isinstance(v, dict):
            return "{" + ", ".join(f"{json_key(k)} = {value(x)}" for k, x in v.items()) + "}"
        raise TypeError(type(v))

    def json_key(k: str) -> str:
        return k if re.fullmatch(r"[A-Za-z0-9_-]+", k) else value(k)

    out = []
    for section, table in data.items():
        if section in _PLAIN_TABLES:
            out += [f"[{section}]", *(f"{json_key(k)} = {value(v)}" for k, v in table.items()), ""]
        else:
            for name, sub in table.items():
                out += [f"[{section}.{json_key(name)}]", *(f"{json_key(k)} = {value(v)}" for k, v in sub.items()), ""]
    return "\n".join(out)


#: Partial job files: the fragment -> (the whole job it is a part of, its task module, more settings
#: the fragment assumes). The fragment must parse and the merged job must pass `localstate validate`.
FRAGMENTS: dict[str, tuple[Path, Path, dict]] = {
    "cluster/objectstore_job.toml": (FIRST / "job.toml", FIRST / "my_tasks.py", {}),
    "cluster/kafka_job.toml": (FIRST / "job.toml", FIRST / "my_tasks.py", {}),
    "durable/shared_directory.toml": (FIRST / "job.toml", FIRST / "my_tasks.py", {}),
    "durable/s3.toml": (FIRST / "job.toml", FIRST / "my_tasks.py", {"job": {"changelog": "objectstore"}}),
    "durable/hdfs.toml": (FIRST / "job.toml", FIRST / "my_tasks.py", {"job": {"changelog": "objectstore"}}),
    "durable/pipelined_commits.toml": (FIRST / "job.toml", FIRST / "my_tasks.py",
                                       {"changelogs": {"objectstore": {"url": "shared"}}}),
    "heap/stores.toml": (FIRST / "job.toml", FIRST / "my_tasks.py", {}),
    "time/ttl_stores.toml": (FIRST / "job.toml", FIRST / "my_tasks.py", {}),
    "kafka/changelog_job.toml": (FIRST / "job.toml", FIRST / "my_tasks.py", {}),
    "kafka/streams_job.toml": (WINDOWED / "job.toml", WINDOWED / "windowed_counts.py", {}),
    "search/stores.toml": (FIRST / "job.toml", FIRST / "my_tasks.py", {}),
    "sketch/stores.toml": (FIRST / "job.toml", FIRST / "my_tasks.py", {}),
    "spark/worker_affinity.toml": (FIRST / "job.toml", FIRST / "my_tasks.py", {}),
    "spark/continuous.toml": (FIRST / "job.toml", FIRST / "my_tasks.py", {}),
    "operations/metrics.toml": (FIRST / "job.toml", FIRST / "my_tasks.py", {}),
    "time/job.toml": (FIRST / "job.toml", FIRST / "my_tasks.py", {}),
    # a plugin's store: validated with that plugin installed as a local plugin of the job's policy
    "plugins/stores.toml": (FIRST / "job.toml", FIRST / "my_tasks.py", {}),
    # not jobs: test_plugin_packaging_files checks these two
    "plugins/pyproject.toml": (FIRST / "job.toml", FIRST / "my_tasks.py", {}),
    "plugins/plugins.toml": (FIRST / "job.toml", FIRST / "my_tasks.py", {}),
}
_NOT_JOBS = {"plugins/pyproject.toml", "plugins/plugins.toml"}

ACME_POLICY = """\
[local]
paths = ["plugins"]
[local.engines]
acme-dict = "acme_dict:DictEngineFactory"
"""


@pytest.mark.parametrize("path", sorted(set(FRAGMENTS) - _NOT_JOBS))
def test_fragment_validates_in_a_whole_job(path: str, tmp_path: Path) -> None:
    base, task_module, extra = FRAGMENTS[path]
    fragment = tomllib.loads(included_file(path).read_text(encoding="utf-8"))
    data = merge(merge(tomllib.loads(base.read_text(encoding="utf-8")), extra), fragment)
    folder = tmp_path / "job"
    folder.mkdir()
    shutil.copy(task_module, folder / task_module.name)
    if path == "plugins/stores.toml":
        shutil.copytree(SNIPPETS / "plugins" / "acme_dict", folder / "plugins" / "acme_dict")
        (folder / "plugins.toml").write_text(ACME_POLICY)
        data["job"]["plugins"] = "plugins.toml"
    job_file = folder / "job.toml"
    job_file.write_text(dump_toml(data))
    assert tomllib.loads(job_file.read_text()) == data
    check_job_file(job_file)


def test_plugin_packaging_files(tmp_path: Path) -> None:
    """docs/plugins.md: the pyproject's entry point names the example's factory; the policy file
    loads, and allows exactly that distribution and plugin."""
    from localstate.core.policy import PluginPolicy

    project = tomllib.loads((SNIPPETS / "plugins" / "pyproject.toml").read_text(encoding="utf-8"))
    target = project["project"]["entry-points"]["localstate.engines"]["acme-dict"]
    module, _, attribute = target.partition(":")
    assert (SNIPPETS / "plugins" / module / "__init__.py").is_file()
    assert f"class {attribute}(" in (SNIPPETS / "plugins" / module / "__init__.py").read_text(encoding="utf-8")

    policy_file = Path(shutil.copy(SNIPPETS / "plugins" / "plugins.toml", tmp_path / "plugins.toml"))
    (tmp_path / "dev-plugins").mkdir()
    policy = PluginPolicy.load(policy_file)
    data = tomllib.loads(policy_file.read_text(encoding="utf-8"))
    assert data["policy"]["allow_distributions"] == [project["project"]["name"]]
    assert policy is not None


# -- shell commands -----------------------------------------------------------------------------------

def shell_commands() -> list[tuple[str, list[str]]]:
    """``(page:line, argv)`` of every command in the nav's bash and console blocks."""
    found = []
    for page, line, language, body in all_blocks():
        if language not in SHELL_LANGUAGES:
            continue
        text = "\n".join(body).replace("\\\n", " ")
        for number, command_line in enumerate(text.splitlines()):
            if language == "console":
                if not command_line.startswith("$ "):
                    continue  # output
                command_line = command_line[2:]
            lexer = shlex.shlex(command_line, posix=True, punctuation_chars=True)
            lexer.whitespace_split = True
            lexer.commenters = "#"
            tokens = list(lexer)
            command: list[str] = []
            for token in tokens + [";"]:
                if token in ("&&", "||", ";", "|", "&", "(", ")"):
                    while command and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", command[0]):
                        command.pop(0)  # VAR=value before the command
                    if command:
                        found.append((f"{page}:{line + 1 + number}", command))
                    command = []
                else:
                    command.append(token)
    return found


def parser_commands() -> tuple[set[str], dict[str, set[str]]]:
    from localstate.tools.cli import build_parser

    parser = build_parser()
    top = {option for action in parser._actions for option in action.option_strings}
    subcommands: dict[str, set[str]] = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, subparser in action.choices.items():
                subcommands[name] = {option for a in subparser._actions for option in a.option_strings}
    return top, subcommands


def bench_names() -> set[str]:
    import pkgutil

    return {m.name for m in pkgutil.iter_modules([str(ROOT / "bench")])
            if m.name != "report" and not m.name.startswith("_") and not m.name.endswith("_cases")}


def test_shell_blocks_show_real_commands() -> None:
    top, subcommands = parser_commands()
    benchmarks = bench_names()
    bad, seen = [], set()
    for where, argv in shell_commands():
        program = Path(argv[0]).name
        if program == "localstate":
            seen.add("localstate")
            words = argv[1:]
            while words and words[0].startswith("-"):
                if words[0].split("=")[0] not in top:
                    bad.append(f"{where}: localstate has no option {words[0]}")
                words = words[1:]
            if not words:
                continue
            name, rest = words[0], words[1:]
            if name not in subcommands:
                bad.append(f"{where}: no subcommand localstate {name}")
                continue
            for word in rest:
                if word.startswith("-") and word != "-" and word.split("=")[0] not in subcommands[name]:
                    bad.append(f"{where}: localstate {name} has no option {word}")
        elif re.fullmatch(r"python3?(\.\d+)?", program) and argv[1:3] == ["-m", "bench"]:
            seen.add("bench")
            if len(argv) > 3 and not argv[3].startswith("-") and argv[3] not in benchmarks:
                bad.append(f"{where}: no benchmark {argv[3]} (bench/: {sorted(benchmarks)})")
    assert not bad, "\n".join(bad)
    assert seen == {"localstate", "bench"}  # the parsing found the commands at all


def test_the_checker_catches_a_wrong_flag() -> None:
    _top, subcommands = parser_commands()
    assert "--yes" in subcommands["reset"] and "--no-such-flag" not in subcommands["reset"]
    assert "kv" in bench_names() and "nope" not in bench_names()
