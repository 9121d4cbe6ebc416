"""Every command of the guides runs as printed (issue #48).

Each command of every ``bash`` and ``console`` block of mkdocs.yml's nav pages either runs here, in a
copy of the files the page works on, or is listed in :data:`NOT_RUN` with the reason (another host,
the test suite itself, a benchmark of minutes, or another test that runs the same thing). A
``console`` block is a transcript: what each command prints must have the shape of what the page
prints (numbers, paths and times aside; a ``...`` line stands for any lines).

A ``localstate run`` without ``--until-drained`` *stands* until it is stopped: the page must say how
(Ctrl-C or SIGTERM, or a ``^C`` line in a transcript), and the test stops it with Ctrl-C once it is
idle. The commands run in one process (tests/docs/transcript_runner.py), so their Spark runs share
one JVM; the pages' commands run in nav order, each page's in its order.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_code_blocks import SHELL_LANGUAGES, all_blocks, nav_pages  # noqa: E402

pytestmark = pytest.mark.spark
ROOT = Path(__file__).resolve().parents[2]
RUNNER = Path(__file__).resolve().parent / "transcript_runner.py"

#: ``page: the start of a command`` (as the shell reads it: quotes removed) -> why it does not run here.
#: The way out of this table is a command that runs.
NOT_RUN: dict[str, str] = {
    "state-as-data.md: ": "the page's worked example, run as printed by tests/spark/test_state_as_data_transcript.py",
    "getting-started.md: python3 -m venv": "the README's commands: .ci/run runs both in a fresh clone",
    "getting-started.md: .venv/bin/pip install": "the README's commands: .ci/run runs both in a fresh clone",
    "getting-started.md: .venv/bin/localstate demo": "the README's run command: .ci/run runs it to verification: OK",
    "getting-started.md: .venv/bin/python -m pytest": "the test suite itself",
    "getting-started.md: .venv/bin/python -m mkdocs": "a server; tests/docs/test_site.py builds the site --strict",
    "examples.md: localstate run examples/": "tests/spark/test_examples.py and test_more_examples.py run these jobs "
                                             "to the end; spark.md's transcript runs windowed_counts with the CLI",
    "heap.md: ": "tests/spark/test_examples.py runs the heap examples (make_input.py, then the job)",
    "spark.md: localstate demo": "the README's run command (.ci/run runs it as printed)",
    "spark.md: python -c": "a standalone cluster on other hosts (10.0.0.1); tests/cluster runs one on loopback",
    "spark.md: $SPARK_HOME/bin/spark-class": "a standalone cluster on other hosts; tests/cluster runs one on loopback",
    "spark.md: PYSPARK_PYTHON=/opt/venv/bin/python localstate run": "a cluster on other hosts; "
                                                                     "tests/cluster/test_cluster_cli.py runs one",
    "cluster.md: aws": "an S3 service elsewhere",
    "cluster.md: weed": "a SeaweedFS server on another host; tests/s3_server.py starts one on loopback",
    "cluster.md: python -m bench cluster": "a benchmark of minutes (docs/benchmarks.md has its figures)",
    "spark-users.md: python examples/dataframe/rate_counts.py": "a 20 s streaming query: "
                                                                 "tests/spark/test_dataframe_example.py runs this script",
    "testing.md: ": "the test suite itself",
    "operations.md: tail -n1 state/my-job/": "a placeholder job's files; tests/spark/test_progress.py checks the fields",
    "operations.md: jq ": "a placeholder job's files",
    "operations.md: spark-submit": "a cluster on other hosts",
    "benchmarks.md: .venv/bin/pip install": "installs packages",
    "benchmarks.md: .venv/bin/python -m bench ": "a benchmark of minutes (its figures are on the page); "
                                                 "`python -m bench` alone, the list, runs",
}


@dataclass
class Command:
    page: str
    where: str
    text: str
    """the command line as printed"""
    argv: list[str]
    env: dict[str, str]
    comment: str
    printed: list[str] | None = None
    """the output a transcript shows (console blocks), None for a bash block"""

    @property
    def words(self) -> str:
        return " ".join([*(f"{k}={v}" for k, v in self.env.items()), *self.argv])

    @property
    def standing(self) -> bool:
        return self.argv[:2] == ["localstate", "run"] and "--until-drained" not in self.argv

    def why_not(self) -> str | None:
        for key, reason in NOT_RUN.items():
            page, _, start = key.partition(": ")
            if page == self.page and self.words.startswith(start):
                return reason
        return None


def _split(command_line: str) -> list[list[str]]:
    """The words of each command of a shell line (``a && b | c``: three), quotes removed."""
    lexer = shlex.shlex(command_line, posix=True, punctuation_chars=True)
    lexer.whitespace_split, lexer.commenters = True, "#"
    found, words = [], []
    for token in list(lexer) + [";"]:
        if token in ("&&", "||", ";", "|", "&", "(", ")"):
            if words:
                found.append(words)
            words = []
        else:
            words.append(token)
    return found


def commands() -> list[Command]:
    found = []
    for page, line, language, body in all_blocks():
        if language not in SHELL_LANGUAGES:
            continue
        lines = "\n".join(body).replace("\\\n", " ").splitlines()
        for number, command_line in enumerate(lines):
            printed = None
            if language == "console":
                if not command_line.startswith("$ "):
                    continue
                command_line = command_line[2:]
                printed = []
                for output in lines[number + 1:]:
                    if output.startswith("$ "):
                        break
                    printed.append(output)
            comment = command_line.split("  #", 1)[1].strip() if "  #" in command_line else ""
            parts = _split(command_line)
            for index, words in enumerate(parts):
                env = {}
                while words and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", words[0]):
                    name, _, value = words.pop(0).partition("=")
                    env[name] = value
                if words:
                    found.append(Command(page, f"{page}:{line + 1 + number}", command_line, words, env, comment,
                                         printed if index == len(parts) - 1 else None))
    return found


# -- where each page's commands run ------------------------------------------------------------------

def _first_task(folder: Path) -> Path:
    shutil.copytree(ROOT / "docs" / "snippets" / "first_task", folder, dirs_exist_ok=True,
                    ignore=shutil.ignore_patterns("work", "__pycache__", "test_*.py"))
    return folder


def _repository(folder: Path) -> Path:
    """A copy of what the pages run from the repository root: the examples and the docs' snippets."""
    ignore = shutil.ignore_patterns(".work", "state", "out", "in", "__pycache__", "checkpoint")
    shutil.copytree(ROOT / "examples", folder / "examples", ignore=ignore, dirs_exist_ok=True)
    shutil.copytree(ROOT / "docs" / "snippets", folder / "docs" / "snippets", ignore=ignore, dirs_exist_ok=True)
    return folder


def _acme_plugin(folder: Path) -> dict[str, str]:
    """docs/plugins.md's distribution, installed as pip would (its package and a dist-info beside it)."""
    site = folder / "site"
    shutil.copytree(ROOT / "docs" / "snippets" / "plugins" / "acme_dict", site / "acme_dict")
    info = site / "acme_localstate_dict-1.2.3.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: acme-localstate-dict\nVersion: 1.2.3\n")
    (info / "entry_points.txt").write_text("[localstate.engines]\nacme-dict = acme_dict:DictEngineFactory\n")
    return {"PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}


#: page -> the folder its commands run in: ``first-task`` (a copy of docs/snippets/first_task, shared by
#: the pages that talk about "job.toml"), ``repository`` (a copy of the examples and snippets, run from
#: their root), ``root`` (the checkout itself: commands that only read it). A command that names a
#: file under examples/ or docs/ runs in the repository copy, whatever its page (:func:`_place`).
PLACES = {"first-task.md": "first-task", "spark.md": "first-task", "operations.md": "first-task",
          "task-api.md": "repository", "state-reader.md": "repository", "plugins.md": "first-task",
          "benchmarks.md": "root"}
#: Exit codes other than 0 that a page says a command returns.
EXIT_CODES = {"localstate status": 3}  # operations.md: 3 when the job is not live (it is not, here)
#: Commands that run only where something else is installed (an environment for them).
ENVIRONMENTS: dict[str, Callable[[Path], dict[str, str]]] = {"plugins.md: localstate plugins": _acme_plugin}
#: Commands that run as a process of their own (they need an environment, or import the checkout's
#: bench package), not in the runner's process.
SUBPROCESS = ("python -m bench", ".venv/bin/python -m bench", "rm ")


def _program(name: str, alone: bool) -> str:
    """The program a command names, as this checkout's venv has it (``.venv/bin/python`` is the
    interpreter running the tests); for a process of its own, the full path of ``localstate``."""
    base = Path(name).name
    if re.fullmatch(r"python3?(\.\d+)?", base):
        return sys.executable if alone else "python"
    if base == "localstate" and alone:
        return str(Path(sys.executable).with_name("localstate"))
    return base


def runnable() -> list[Command]:
    """The commands that run: not in :data:`NOT_RUN`, and a bash line only once when the page's
    transcript runs the same command (the transcript's run is the one checked)."""
    found = [command for command in commands() if command.why_not() is None]
    shown = {(c.page, c.words) for c in found if c.printed is not None}
    return [c for c in found if c.printed is not None or (c.page, c.words) not in shown]


def _place(command: Command) -> str:
    """Where a command runs: a copy of the repository's files when it names one, else its page's place."""
    if any(word.startswith(("examples/", "docs/")) for word in command.argv):
        return "repository"
    return PLACES[command.page]


def test_every_command_runs_or_says_why_not() -> None:
    found = commands()
    assert len(found) > 60, len(found)
    used = {key for key in NOT_RUN for command in found
            if command.page == key.partition(": ")[0] and command.words.startswith(key.partition(": ")[2])}
    assert used == set(NOT_RUN), f"stale NOT_RUN entries: {sorted(set(NOT_RUN) - used)}"
    homeless = sorted({command.page for command in runnable()} - set(PLACES))
    assert not homeless, f"pages with commands that run but no place to run them (PLACES): {homeless}"
    assert {command.page for command in found} <= set(nav_pages())


def test_standing_runs_say_how_they_stop() -> None:
    """A ``localstate run`` without ``--until-drained`` stands until stopped: the page says how."""
    bad = []
    for command in commands():
        if command.standing and command.why_not() is None:
            said = command.comment + " ".join(command.printed or [])
            if not re.search(r"Ctrl-C|SIGTERM|\^C", said):
                bad.append(f"{command.where}: {command.text}")
    assert not bad, "standing runs without a word on how they stop:\n" + "\n".join(bad)


# -- running them ---------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[tuple[Command, dict[str, Any]]]]:
    """Every runnable command run once, in one process: page -> its commands with their results."""
    base = tmp_path_factory.mktemp("transcripts")
    places = {"first-task": _first_task(base / "first-task"), "repository": _repository(base / "repository"),
              "root": ROOT}
    todo = runnable()
    steps = []
    for command in todo:
        env = dict(command.env)
        make_env = ENVIRONMENTS.get(f"{command.page}: {command.words}")
        if make_env is not None:
            env.update(make_env(base / f"env-{len(steps)}"))
        alone = make_env is not None or command.words.startswith(SUBPROCESS)
        argv = [_program(command.argv[0], alone), *command.argv[1:]]
        steps.append({"argv": argv, "cwd": str(places[_place(command)]), "env": env, "timeout": 300,
                      "standing": command.standing, "subprocess": alone})
    done = subprocess.run([sys.executable, str(RUNNER)], input=json.dumps(steps), capture_output=True, text=True,
                          timeout=1800, cwd=base)
    assert done.returncode == 0, done.stderr[-6000:]
    outcomes = json.loads(done.stdout)
    by_page: dict[str, list[tuple[Command, dict[str, Any]]]] = {}
    for command, outcome in zip(todo, outcomes):
        by_page.setdefault(command.page, []).append((command, outcome))
    return by_page


_SHAPES = [
    (re.compile(r"\b[0-9a-f]{32}\b"), "ID"),
    (re.compile(r"(?:\.\.\.|~)?/[\w.@%+=:,/-]*[\w/]"), "PATH"),
    (re.compile(r"\d[\d,]*(?:\.\d+)?"), "N"),
    (re.compile(r"\s+"), " "),
]


def shape(line: str) -> str:
    """A line without what changes from run to run: ids, paths, numbers, runs of spaces."""
    for pattern, replacement in _SHAPES:
        line = pattern.sub(replacement, line)
    return line.strip()


def matches(printed: list[str], actual: list[str]) -> bool:
    """Whether ``actual`` has the shape of ``printed``: line by line; a printed ``...`` line stands for
    any lines (none included), a printed line ending in ``...`` for any line that starts like it; a
    ``^C`` line is where the reader pressed Ctrl-C (the terminal's echo, not output); blank lines
    do not count."""
    want = [line for line in printed if line.strip() and line.strip() != "^C"]
    got = [line for line in actual if line.strip()]

    def walk(i: int, j: int) -> bool:
        if i == len(want):
            return j == len(got)
        line = want[i].strip()
        if line == "...":
            return any(walk(i + 1, k) for k in range(j, len(got) + 1))
        if j == len(got):
            return False
        if line.endswith("...") and shape(got[j]).startswith(shape(line[:-3])):
            return walk(i + 1, j + 1)
        return shape(line) == shape(got[j]) and walk(i + 1, j + 1)

    return walk(0, 0)


def test_the_shape_checker() -> None:
    assert matches(["done: 1 batch(es), 5 records in, 49.2s (0.1 rec/s)"], ["done: 3 batch(es), 10,000 records in, 1.5s (6,667 rec/s)"])
    assert not matches(["done: 1 batch(es), 5 records in"], ["standing: waiting for new input"])
    assert matches(["a", "...", "z"], ["a", "b", "c", "z"]) and matches(["a", "...", "z"], ["a", "z"])
    assert matches(["state in .../examples/x/state", "^C"], ["state in /tmp/p/examples/x/state"])
    assert not matches(["a", "b"], ["a"]) and not matches(["a"], ["a", "b"])


def _pages() -> list[str]:
    return sorted({command.page for command in runnable()})


@pytest.mark.parametrize("page", _pages())
def test_the_pages_commands_run_as_printed(page: str, results: dict) -> None:
    problems = []
    for command, outcome in results.get(page, []):
        expected = next((code for prefix, code in EXIT_CODES.items() if " ".join(command.argv).startswith(prefix)), 0)
        if outcome["code"] != expected:
            problems.append(f"{command.where}: {command.text}\n  exit {outcome['code']} (expected {expected})\n"
                            f"{outcome['out'][-2000:]}{outcome['err'][-3000:]}")
            continue
        if command.standing and outcome["stopped"] != "idle":
            problems.append(f"{command.where}: {command.text}\n  a standing run that did not settle: "
                            f"{outcome['stopped']}\n{outcome['out'][-2000:]}")
        if command.printed is not None and not matches(command.printed, outcome["out"].splitlines()):
            problems.append(f"{command.where}: {command.text}\n  printed:\n    " + "\n    ".join(command.printed)
                            + "\n  got:\n    " + "\n    ".join(outcome["out"].splitlines()))
    assert not problems, "\n\n".join(problems)
