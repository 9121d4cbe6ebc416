"""MkDocs hooks of the documentation site (``hooks:`` in mkdocs.yml).

* The API reference: localstate's subpackages live in top-level folders (``core/``, ``runtime/``, ...)
  that pyproject's ``package-dir`` maps into ``localstate``. Static analysis (griffe) cannot follow
  that mapping, so :func:`on_config` builds a tree of symbolic links shaped like the installed
  package, from that same table, and puts it first on mkdocstrings' paths.
* Two reference pages are generated at build time, so they cannot drift from the code:
  ``reference/config.md``, every job-config key with its type, default and meaning, read from the
  config schema (``core/config.py``, the ``Option`` declarations of the built-in plugins, the stream
  contract's common options), and ``reference/cli.md``, the ``--help`` of every subcommand of the
  parser ``tools/cli.py`` builds.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import tomllib
from pathlib import Path
from typing import Any

from mkdocs.exceptions import PluginError
from mkdocs.plugins import event_priority
from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parent.parent

# The meaning of the [job] keys and of the keys every [stores.<name>] table takes: the code checks
# them (core/config.py: _JOB_KEYS, _STORE_KEYS) but does not declare them as Options.
_KEY_DOCS = tomllib.loads((ROOT / "docs" / "config_keys.toml").read_text(encoding="utf-8"))
JOB_KEYS: dict[str, tuple[str, str, str]] = {
    key: (doc["type"], doc["default"], doc["meaning"]) for key, doc in _KEY_DOCS["job"].items()}
STORE_KEYS: dict[str, tuple[str, str, str]] = {
    key: (doc["type"], doc["default"], doc["meaning"]) for key, doc in _KEY_DOCS["stores"].items()}

GROUP_TITLES = {"engines": "Engine", "changelogs": "Changelog system", "streams": "Stream system"}


# -- the API reference: a package-shaped tree for griffe ---------------------------------------------

def package_tree() -> Path:
    """A temporary directory holding ``localstate/`` laid out as installed: the files of
    ``src/localstate`` and one link per mapped subpackage (pyproject's ``package-dir``)."""
    mapping = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]["package-dir"]
    tree = Path(tempfile.mkdtemp(prefix="localstate-docs-"))
    package = tree / "localstate"
    package.mkdir()
    subpackages = {name.split(".", 1)[1]: folder for name, folder in mapping.items() if name.startswith("localstate.")}
    for entry in (ROOT / mapping["localstate"]).iterdir():
        if entry.name not in subpackages and entry.name != "__pycache__":
            (package / entry.name).symlink_to(entry)
    for name, folder in subpackages.items():
        (package / name).symlink_to(ROOT / folder, target_is_directory=True)
    return tree


_TREES: list[Path] = []


@event_priority(100)  # before mkdocstrings creates its handler
def on_config(config: Any) -> Any:
    tree = package_tree()
    _TREES.append(tree)
    handler = config.plugins["mkdocstrings"].config.handlers.setdefault("python", {})
    handler["paths"] = [str(tree)] + [p for p in handler.get("paths", []) if p != str(tree)]
    return config


def on_shutdown() -> None:
    for tree in _TREES:
        shutil.rmtree(tree, ignore_errors=True)


# -- generated pages ----------------------------------------------------------------------------------

def on_files(files: Files, config: Any) -> Files:
    for path, content in (("reference/config.md", config_reference()), ("reference/cli.md", cli_reference())):
        files.append(File.generated(config, path, content=content))
    return files


def _cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _type_name(option: Any) -> str:
    names = {int: "integer", float: "number", str: "string", bool: "boolean", dict: "table", list: "list"}
    types = option.type if isinstance(option.type, tuple) else (option.type,)
    text = " or ".join(names.get(t, t.__name__) for t in types)
    if option.choices is not None:
        text += ": " + ", ".join(f"`{c}`" for c in option.choices)
    if option.minimum is not None or option.maximum is not None:
        low = "" if option.minimum is None else f"{option.minimum:g}"
        high = "" if option.maximum is None else f"{option.maximum:g}"
        text += f" ({low}..{high})"
    return text


def _default(option: Any) -> str:
    if option.required:
        return "required"
    if option.default is None:
        return "unset"
    value = option.default
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, str):
        return f'`"{value}"`'
    if isinstance(value, dict) and not value:
        return "`{}`"
    return f"`{value!r}`"


def _anchor(section: str, plugin: str, key: str) -> tuple[str, str]:
    """The row's HTML id and its machine-readable key ``section:plugin:key`` (read by tests/docs)."""
    ident = "cfg-" + "-".join(p.replace("_", "-").replace(".", "-") for p in (section, plugin, key) if p)
    return ident, f"{section}:{plugin}:{key}"


def _row(key_id: tuple[str, str], key: str, type_: str, default: str, meaning: str) -> str:
    ident, data = key_id
    return (f'| <span id="{ident}" data-config-key="{data}"></span>`{key}` | {_cell(type_)} | {_cell(default)} | '
            f'{_cell(meaning)} |')


_HEADER = ["| key | type | default | meaning |", "|---|---|---|---|"]


def _option_rows(section: str, plugin: str, options: Any, prefix: str = "") -> list[str]:
    from localstate.core.options import live_options

    return [_row(_anchor(section, plugin, name), prefix + name, _type_name(option), _default(option), option.doc)
            for name, option in live_options(options).items()]


def builtin_plugins(group: str) -> list[tuple[str, Any]]:
    """The built-in plugins of ``group`` (name, loaded class or factory), sorted by name."""
    from localstate.core.registry import BUILTIN_DISTRIBUTION, Registry

    registry = Registry()
    return [(info.name, registry.load(group, info.name)) for info in registry.available(group)
            if info.distribution == BUILTIN_DISTRIBUTION]


def config_reference() -> str:
    from localstate.core import config
    from localstate.core.stream import COMMON_INPUT_OPTIONS, COMMON_OUTPUT_OPTIONS
    from localstate.core.time import TIME_OPTIONS, TIMER_STORE
    from localstate.runtime.spark.config import SPARK_OPTIONS

    for code_keys, documented, what in ((config._JOB_KEYS, JOB_KEYS, "[job]"),
                                        (config._STORE_KEYS, STORE_KEYS, "[stores.<name>]")):
        if set(code_keys) != set(documented):
            raise PluginError(f"docs/hooks.py: the {what} keys documented ({sorted(documented)}) differ from "
                              f"the keys core/config.py accepts ({sorted(code_keys)}): update the table in docs/hooks.py")

    out = ["# Job configuration reference", "",
           "Every key a job file (`job.toml`) accepts, generated from the configuration schema when the site is "
           "built (`core/config.py` and the `Option` declarations of the built-in plugins), so it lists exactly "
           "what `localstate validate` accepts. Durations are a number of seconds or a string such as "
           "`\"250ms\"`, `\"10s\"`, `\"5m\"`; sizes are a number of bytes or a string such as `\"64MB\"`. "
           "Third-party plugins declare their own options: `localstate plugins` lists what is installed.", ""]

    out += ["## `[job]`", "", *_HEADER]
    out += [_row(_anchor("job", "", key), key, *JOB_KEYS[key]) for key in sorted(JOB_KEYS)]

    out += ["", "## `[stores.<name>]`", "",
            "Keys every store takes, whatever its engine; the engine's own options follow, per engine.", "",
            *_HEADER]
    out += [_row(_anchor("stores", "", key), key, *STORE_KEYS[key]) for key in sorted(STORE_KEYS)]
    for name, factory in builtin_plugins("engines"):
        out += ["", f"### `engine = \"{name}\"`", ""]
        if getattr(factory, "description", ""):
            out += [factory.description[0].upper() + factory.description[1:] + ".", ""]
        out += [*_HEADER, *_option_rows("stores", name, factory.options)]

    out += ["", "## `[changelogs.<system>]`", "",
            "Options of a changelog system, used by every store whose changelog it holds (`job.changelog`).", ""]
    for name, system in builtin_plugins("changelogs"):
        out += [f"### `[changelogs.{name}]`", ""]
        if getattr(system, "description", ""):
            out += [system.description[0].upper() + system.description[1:] + ".", ""]
        out += ([*_HEADER, *_option_rows("changelogs", name, system.options)] if system.options
                else ["No options."])
        out += [""]

    streams = builtin_plugins("streams")
    for section, side, common in (("inputs", "input", COMMON_INPUT_OPTIONS),
                                  ("outputs", "output", COMMON_OUTPUT_OPTIONS)):
        out += [f"## `[{section}.<name>]`", "",
                f"`system` picks the stream system; the keys below it apply to every {side}, then each system's "
                "own.", "", *_HEADER,
                _row(_anchor(section, "", "system"), "system", "string", "required",
                     f"the {side}'s stream system: " + ", ".join(f"`{n}`" for n, s in streams
                                                                   if getattr(s, side, None) is not None)),
                *_option_rows(section, "", common)]
        for name, system in streams:
            stream_class = getattr(system, side, None)
            if stream_class is None:
                continue
            out += ["", f"### `system = \"{name}\"` ({side})", ""]
            out += ([*_HEADER, *_option_rows(section, name, stream_class.options)] if stream_class.options
                    else ["No options beyond the common ones."])
        out += [""]

    out += ["## `[spark]`", "", "Settings of `localstate run` (command-line flags win).", "", *_HEADER,
            *_option_rows("spark", "", SPARK_OPTIONS), ""]
    out += ["## `[time]`", "", "The watermark and the timers of every task partition (see "
            "[Time](../time/index.md)). With `timers = true` the job gets the internal logged kv store "
            f"`{TIMER_STORE}`, a store name no `[stores.<name>]` table may take.", "", *_HEADER,
            *_option_rows("time", "", TIME_OPTIONS), ""]
    return "\n".join(out)


def cli_reference() -> str:
    import argparse

    from localstate.tools.cli import build_parser

    previous = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "100"  # argparse wraps help to the terminal: a fixed width for the page
    try:
        parser = build_parser()
        out = ["# Command line reference", "",
               "The `localstate` command, generated from its argument parser (`tools/cli.py`) when the site is "
               "built: the `--help` of the command and of every subcommand. Exit codes: 0 success, 1 a "
               "localstate error (message on stderr), 2 usage error.", "",
               "## `localstate`", "", "```text", parser.format_help().rstrip(), "```", ""]
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, subparser in sorted(action.choices.items()):
                    out += [f"## `localstate {name}` {{#localstate-{name}}}", "",
                            "```text", subparser.format_help().rstrip(), "```", ""]
        return "\n".join(out)
    finally:
        if previous is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = previous
