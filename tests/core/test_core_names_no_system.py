"""The core names no changelog system, stream system or engine: it reaches them through the plugin
registry and optional capabilities (``localstate.core.changelog``'s Protocols), never by import."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from localstate.core.registry import Registry
from localstate.core.stream import StreamSystem

CORE = Path(__file__).resolve().parents[2] / "core"
FORBIDDEN = ("localstate.changelog", "localstate.engines")


def _imports(path: Path) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module))
    return found


def test_no_core_module_imports_a_changelog_or_engine():
    offenders = [f"{path.relative_to(CORE.parent)}:{line}: {module}"
                 for path in sorted(CORE.rglob("*.py"))
                 for line, module in _imports(path)
                 if any(module == name or module.startswith(name + ".") for name in FORBIDDEN)]
    assert offenders == []


@pytest.mark.parametrize("name, has_input, has_output", [
    ("jsonl", True, True), ("file", True, True), ("kafka", True, True), ("generator", True, False)])
def test_builtin_stream_systems_are_plugins(name, has_input, has_output):
    system = Registry().load("streams", name)
    assert issubclass(system, StreamSystem)
    assert (system.input is not None, system.output is not None) == (has_input, has_output)


def _job(tmp_path, system: str, policy: str = "[policy]\n"):
    from localstate.core.config import parse_job_config

    (tmp_path / "plugins.toml").write_text(policy)
    data = {"job": {"name": "j", "task": "m:T", "state_dir": str(tmp_path / "state")},
            "inputs": {"events": {"system": system}}}
    return parse_job_config(data, plugins=tmp_path / "plugins.toml")


def test_unknown_stream_system_is_a_did_you_mean_config_error(tmp_path):
    from localstate.core.stream import open_input
    from localstate.errors import ConfigError

    with pytest.raises(ConfigError) as info:
        open_input(_job(tmp_path, "generater"), "events")
    text = str(info.value)
    assert "inputs.events.system" in text and "unknown input system 'generater'" in text
    assert "generator" in text


def test_plugin_policy_governs_stream_systems(tmp_path):
    from localstate.core.stream import open_input
    from localstate.errors import PluginRefusedError

    job = _job(tmp_path, "generator", '[policy]\ndeny_plugins = ["streams.generator"]\n')
    with pytest.raises(PluginRefusedError):
        open_input(job, "events")
