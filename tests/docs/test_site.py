"""The documentation site (mkdocs.yml, docs/): it builds in strict mode, its generated references match
the code, its links resolve, and the Getting-started code is code that runs.

One strict build per session (a few seconds) is shared by the tests that read the built HTML.
"""

from __future__ import annotations

import argparse
import html
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

from localstate.core.options import live_options
from localstate.core.time import TIME_OPTIONS
from localstate.runtime.spark.config import SPARK_OPTIONS

ROOT = Path(__file__).resolve().parents[2]
SNIPPETS = ROOT / "docs" / "snippets" / "first_task"

pytest.importorskip("mkdocs")
pytest.importorskip("mkdocstrings")

# One xdist worker runs the module, so the site (the `site` fixture, a build of most of a minute) is
# built once, not once per worker that takes one of its tests.
pytestmark = pytest.mark.xdist_group("docs-site")


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    result = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
                            cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, f"mkdocs build --strict failed:\n{result.stdout}\n{result.stderr}"
    return out


def test_strict_build_writes_every_page(site: Path) -> None:
    for page in ("index.html", "getting-started/index.html", "reference/api/index.html",
                 "reference/contracts/index.html", "reference/config/index.html", "reference/cli/index.html",
                 "benchmarks/index.html", "upgrades/index.html"):
        assert (site / page).is_file(), page
    api = (site / "reference/api/index.html").read_text(encoding="utf-8")
    for name in ("StreamTask", "TaskTestDriver", "LocalStateError", "foreach_batch"):
        assert name in api, f"{name} missing from the API reference"


# -- the configuration reference: exactly the keys `localstate validate` accepts ------------------------

def accepted_keys() -> set[str]:
    """Every key the job-config schema accepts, as ``section:plugin:key``, read from the code."""
    from localstate.core import config
    from localstate.core.registry import BUILTIN_DISTRIBUTION, Registry
    from localstate.core.stream import COMMON_INPUT_OPTIONS, COMMON_OUTPUT_OPTIONS

    registry = Registry()

    def builtins(group: str) -> list[tuple[str, object]]:
        return [(info.name, registry.load(group, info.name)) for info in registry.available(group)
                if info.distribution == BUILTIN_DISTRIBUTION]

    keys = {f"job::{key}" for key in config._JOB_KEYS}
    keys |= {f"stores::{key}" for key in config._STORE_KEYS}
    keys |= {f"spark::{key}" for key in live_options(SPARK_OPTIONS)}
    keys |= {f"time::{key}" for key in TIME_OPTIONS}
    for name, factory in builtins("engines"):
        keys |= {f"stores:{name}:{key}" for key in live_options(factory.options)}
    for name, system in builtins("changelogs"):
        keys |= {f"changelogs:{name}:{key}" for key in system.options}
    for section, side, common in (("inputs", "input", COMMON_INPUT_OPTIONS),
                                  ("outputs", "output", COMMON_OUTPUT_OPTIONS)):
        keys |= {f"{section}::system"} | {f"{section}::{key}" for key in common}
        for name, system in builtins("streams"):
            stream_class = getattr(system, side, None)
            if stream_class is not None:
                keys |= {f"{section}:{name}:{key}" for key in stream_class.options}
    return keys


def documented_keys(site: Path) -> set[str]:
    page = (site / "reference/config/index.html").read_text(encoding="utf-8")
    return set(re.findall(r'data-config-key="([^"]+)"', page))


def test_config_reference_lists_exactly_the_accepted_keys(site: Path) -> None:
    documented, accepted = documented_keys(site), accepted_keys()
    assert not accepted - documented, f"accepted but not documented: {sorted(accepted - documented)}"
    assert not documented - accepted, f"documented but not accepted: {sorted(documented - accepted)}"


def test_documented_job_keys_pass_validation_and_others_do_not(site: Path) -> None:
    """Against the validator itself, not only its tables: no documented [job] or [spark] key is
    reported as unknown, and an undocumented one is."""
    from localstate.core.config import parse_job_config
    from localstate.runtime.spark.config import SparkConfig

    documented = documented_keys(site)
    for section in ("job", "spark"):
        names = {key.split(":", 2)[2] for key in documented if key.startswith(f"{section}::")}
        problems: list = []
        table = {name: object() for name in names | {"not_a_documented_key"}}
        if section == "job":
            parse_job_config({section: table}, collect=problems)
        else:  # [spark] is the Spark runtime's table: validate and every run on Spark check it there
            SparkConfig.parse(table, collect=problems)
        unknown = {p.path.split(".", 1)[1] for p in problems if p.path.startswith(f"{section}.")
                   and p.message.startswith(("unknown key", "unknown option"))}
        assert unknown == {"not_a_documented_key"}, (section, unknown)


# -- the CLI reference: every subcommand ---------------------------------------------------------------

def test_cli_reference_lists_every_subcommand(site: Path) -> None:
    from localstate.tools.cli import build_parser

    parser = build_parser()
    commands = {name for action in parser._actions if isinstance(action, argparse._SubParsersAction)
                for name in action.choices}
    assert commands
    page = (site / "reference/cli/index.html").read_text(encoding="utf-8")
    listed = set(re.findall(r'id="localstate-([a-z0-9_-]+)"', page))
    assert listed == commands
    for name in commands:
        assert f"usage: localstate {name}" in html.unescape(page), name


# -- links ---------------------------------------------------------------------------------------------

_LINK = re.compile(r'<(?:a|link|img|script)\b[^>]*?\b(?:href|src)="([^"]*)"', re.IGNORECASE)
_ID = re.compile(r'\bid="([^"]+)"')


def test_built_site_has_no_broken_relative_links(site: Path) -> None:
    pages = {path: path.read_text(encoding="utf-8", errors="replace") for path in site.rglob("*.html")}
    ids = {path: set(_ID.findall(text)) for path, text in pages.items()}
    broken = []
    for path, text in pages.items():
        for raw in _LINK.findall(text):
            link = urlsplit(html.unescape(raw))
            if link.scheme or link.netloc or link.path.startswith("/"):
                continue  # external, or absolute (only 404.html has those, without a site_url)
            target = (path.parent / unquote(link.path)).resolve() if link.path else path
            if target.is_dir():
                target = target / "index.html"
            if not target.exists():
                broken.append(f"{path.relative_to(site)}: {raw}")
            elif link.fragment and target.suffix == ".html" and target in ids \
                    and unquote(link.fragment) not in ids[target]:
                broken.append(f"{path.relative_to(site)}: {raw} (no such anchor)")
    assert not broken, "\n".join(broken)


# -- the Getting-started code runs ---------------------------------------------------------------------

def test_getting_started_pages_include_the_tested_files() -> None:
    task = (ROOT / "docs/first-task.md").read_text(encoding="utf-8")
    assert '--8<-- "first_task/my_tasks.py"' in task and '--8<-- "first_task/job.toml"' in task
    assert '--8<-- "first_task/test_my_tasks.py"' in (ROOT / "docs/first-test.md").read_text(encoding="utf-8")


def test_first_task_job_file_validates(tmp_path: Path) -> None:
    for name in ("my_tasks.py", "job.toml"):
        shutil.copy(SNIPPETS / name, tmp_path / name)
    result = subprocess.run([sys.executable, "-m", "localstate.tools.cli", "validate", str(tmp_path / "job.toml")],
                            cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert not (tmp_path / "work").exists()  # validate writes nothing


def test_first_test_runs(tmp_path: Path) -> None:
    for name in ("my_tasks.py", "test_my_tasks.py"):
        shutil.copy(SNIPPETS / name, tmp_path / name)
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider",
                             "--rootdir", str(tmp_path), "-c", os.devnull, "test_my_tasks.py"],
                            cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 passed" in result.stdout
