"""The plugin policy fails closed and cannot be hijacked (issue 15).

Every hostile plugin here is a real module on a real sys.path entry that writes a marker file when
imported; "never ran" means the marker does not exist. Distributions are hand-made ``.dist-info``
directories read by importlib.metadata, exactly as an installed wheel would be.
"""

from __future__ import annotations

import importlib
import importlib.metadata as metadata
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from localstate.core.config import load_job_config, parse_job_config
from localstate.core.policy import (ENV_VAR, PluginPolicy, is_builtin_entry_point, locate_policy,
                                    normalize_distribution)
from localstate.core.registry import Registry
from localstate.errors import ConfigError, PluginRefusedError

JOB = '[job]\nname = "j"\ntask = "m:T"\n{extra}\n[stores.s]\nengine = "{engine}"\nbackend = "memory"\n'


def evil_module(directory: Path, module: str, marker: Path) -> None:
    """A plugin module whose import leaves ``marker`` behind (and would otherwise work)."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{module}.py").write_text(
        f"from pathlib import Path\nPath({str(marker)!r}).write_text('imported')\n"
        "from localstate.engines.kv import KeyValueEngineFactory as Factory\n")


def write_dist(site: Path, name: str, entry_points: str, version: str = "1.0") -> Path:
    info = site / f"{name}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    (info / "entry_points.txt").write_text(entry_points)
    return info


@pytest.fixture
def marker(tmp_path):
    path = tmp_path / "MARKER-plugin-code-ran"
    yield path


@pytest.fixture
def evil_site(tmp_path, marker):
    """``Evil_Plugin`` 1.0 installed in a temporary sys.path entry: engine ``evil`` and an attempt
    to take the built-in name ``kv``."""
    site = tmp_path / "site"
    evil_module(site, "evil_plugin_mod", marker)
    write_dist(site, "Evil_Plugin", "[localstate.engines]\nevil = evil_plugin_mod:Factory\n"
                                    "kv = evil_plugin_mod:Factory\n")
    sys.path.insert(0, str(site))
    importlib.invalidate_caches()
    yield site
    sys.path.remove(str(site))
    sys.modules.pop("evil_plugin_mod", None)
    importlib.invalidate_caches()


@pytest.fixture(autouse=True)
def no_operator_policy(monkeypatch):
    monkeypatch.delenv(ENV_VAR, raising=False)


def job_file(directory: Path, engine: str = "kv", extra: str = "") -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "job.toml"
    path.write_text(JOB.format(engine=engine, extra=extra))
    return path


# -- a hostile plugins.toml in an ancestor ---------------------------------------------------------
def hostile_ancestor(tmp_path: Path, marker: Path) -> Path:
    evil_module(tmp_path / "evil", "hijack_mod", marker)
    (tmp_path / "plugins.toml").write_text(
        '[policy]\noverride_builtins = true\n[aliases.engines]\nkv = "hijack"\n'
        '[local]\npaths = ["evil"]\ntrusted = true\n[local.engines]\nhijack = "hijack_mod:Factory"\n')
    return job_file(tmp_path / "project" / "job")


@pytest.mark.parametrize("cwd", ["job", "root", "project"])
def test_ancestor_plugins_toml_never_governs_a_job(tmp_path, marker, monkeypatch, cwd):
    job = hostile_ancestor(tmp_path, marker)
    (tmp_path / "project" / "pyproject.toml").write_text("[project]\nname = 'p'\n")
    monkeypatch.chdir({"job": job.parent, "root": tmp_path, "project": tmp_path / "project"}[cwd])
    config = load_job_config(job)
    assert config.policy.source is None and config.policy.origin == "default"
    factory = config.registry.engine_factory("kv")
    assert type(factory).__module__.startswith("localstate.")
    assert not marker.exists()


def test_ancestor_plugins_toml_is_ignored_by_the_cli(tmp_path, marker):
    job = hostile_ancestor(tmp_path, marker)
    env = {k: v for k, v in os.environ.items() if k != ENV_VAR}
    for argv in (["validate", str(job)], ["plugins", str(job)], ["plugins"]):
        result = subprocess.run([sys.executable, "-m", "localstate", *argv], capture_output=True, text=True,
                                cwd=job.parent, env=env)
        assert result.returncode in (0, 1), result.stderr
        assert "Traceback" not in result.stderr
        assert "hijack" not in result.stdout
        assert not marker.exists(), argv


def test_alias_of_a_builtin_in_the_job_folder_is_refused(tmp_path, marker):
    job = job_file(tmp_path / "job")
    evil_module(job.parent / "dev", "hijack_mod", marker)
    (job.parent / "plugins.toml").write_text(
        '[aliases.engines]\nkv = "hijack"\n[local]\npaths = ["dev"]\n[local.engines]\nhijack = "hijack_mod:Factory"\n')
    with pytest.raises(ConfigError) as info:
        load_job_config(job)
    assert [p.path for p in info.value.problems] == ["aliases.engines.kv"]
    assert str(job.parent / "plugins.toml") in str(info.value)
    assert "override_builtins" in str(info.value)
    assert not marker.exists()


@pytest.mark.parametrize("group, name", [("engines", "kv"), ("serdes", "json"), ("changelogs", "file")])
def test_local_plugin_cannot_take_a_builtin_name(tmp_path, group, name):
    path = tmp_path / "plugins.toml"
    path.write_text(f'[local]\ntrusted = true\n[local.{group}]\n{name} = "anything:Thing"\n')
    with pytest.raises(ConfigError) as info:
        PluginPolicy.load(path)
    assert [p.path for p in info.value.problems] == [f"local.{group}.{name}"]


def test_explicit_builtin_override_works_and_is_reported_loudly(tmp_path, marker):
    evil_module(tmp_path / "dev", "mine_mod", marker)
    path = tmp_path / "plugins.toml"
    path.write_text('[policy]\noverride_builtins = true\n[aliases.engines]\nkv = "mine"\n'
                    '[local]\npaths = ["dev"]\ntrusted = true\n[local.engines]\nmine = "mine_mod:Factory"\n')
    policy = PluginPolicy.load(path)
    assert policy.overridden_builtins() == [("engines", "kv", "mine")]
    result = subprocess.run([sys.executable, "-m", "localstate", "--plugins", str(path), "plugins"],
                            capture_output=True, text=True, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "WARNING: built-in engine 'kv' is replaced by 'mine'" in result.stdout


# -- look-alike distribution names ----------------------------------------------------------------
@pytest.mark.parametrize("spelling", ["evil-plugin", "EVIL_PLUGIN", "evil.plugin", "Evil__-Plugin"])
def test_deny_distributions_matches_pep503_spellings(evil_site, marker, spelling, tmp_path):
    path = tmp_path / "p.toml"
    path.write_text(f'[policy]\ndeny_distributions = ["{spelling}"]\n')
    registry = Registry(PluginPolicy.load(path))
    with pytest.raises(PluginRefusedError) as info:
        registry.engine_factory("evil")
    assert "Evil_Plugin" in str(info.value)
    assert not marker.exists()


def test_allow_distributions_is_normalised_too(evil_site, tmp_path):
    path = tmp_path / "p.toml"
    path.write_text('[policy]\nmode = "allowlist"\nallow_distributions = ["evil.PLUGIN"]\n')
    infos = {i.name: i for i in Registry(PluginPolicy.load(path)).available("engines")}
    assert infos["evil"].allowed


def test_installed_plugin_cannot_take_a_builtin_name(evil_site, marker):
    registry = Registry(PluginPolicy())  # open: every installed plugin may load, but not as "kv"
    shadow = [i for i in registry.available("engines") if i.name == "kv" and i.distribution == "Evil_Plugin"]
    assert shadow and not shadow[0].allowed and "built-in" in shadow[0].reason
    assert type(registry.engine_factory("kv")).__module__.startswith("localstate.")
    assert not marker.exists()


def test_operator_allowlist_blocks_what_the_job_policy_opens(evil_site, marker, tmp_path, monkeypatch):
    operator = tmp_path / "operator.toml"
    operator.write_text('[policy]\nmode = "allowlist"\n')
    job = job_file(tmp_path / "job", engine="evil", extra='plugins = "open.toml"')
    (job.parent / "open.toml").write_text('[policy]\nmode = "open"\n')
    monkeypatch.setenv(ENV_VAR, str(operator))
    with pytest.raises(ConfigError) as info:
        load_job_config(job)
    assert [p.path for p in info.value.problems] == ["stores.s.engine"]
    assert not marker.exists()


def test_lookalike_localstate_distribution_is_not_builtin(tmp_path):
    info = write_dist(tmp_path, "LocalState", "[localstate.engines]\nkv = evil_mod:Factory\n")
    (ep,) = metadata.PathDistribution(info).entry_points
    assert normalize_distribution(ep.dist.name) == "localstate"
    assert not is_builtin_entry_point(ep)
    assert all(is_builtin_entry_point(e) for e in metadata.entry_points(group="localstate.engines")
               if e.dist and e.dist.name == "localstate")


# -- local plugins follow the same rules -----------------------------------------------------------
def local_policy(tmp_path: Path, marker: Path, policy: str, local: str = "") -> Path:
    evil_module(tmp_path / "dev", "scratch_mod", marker)
    path = tmp_path / "plugins.toml"
    path.write_text(f'[policy]\n{policy}\n[local]\npaths = ["dev"]\n{local}\n'
                    '[local.engines]\nscratch = "scratch_mod:Factory"\n')
    return path


def test_local_plugin_needs_allowlisting_in_allowlist_mode(tmp_path, marker):
    registry = Registry(PluginPolicy.load(local_policy(tmp_path, marker, 'mode = "allowlist"')))
    with pytest.raises(PluginRefusedError) as info:
        registry.engine_factory("scratch")
    assert "allow_plugins" in str(info.value)
    assert not marker.exists()
    assert str(tmp_path / "dev") not in sys.path  # refusing a local plugin changes nothing


@pytest.mark.parametrize("policy, local", [('mode = "allowlist"\nallow_plugins = ["engines.scratch"]', ""),
                                           ('mode = "allowlist"', "trusted = true")])
def test_local_plugin_allowed_by_name_or_trust(tmp_path, marker, policy, local):
    registry = Registry(PluginPolicy.load(local_policy(tmp_path, marker, policy, local)))
    try:
        assert registry.engine_factory("scratch") is not None
        assert marker.exists()
    finally:
        sys.modules.pop("scratch_mod", None)
        if str(tmp_path / "dev") in sys.path:
            sys.path.remove(str(tmp_path / "dev"))


@pytest.mark.parametrize("deny", ['deny_plugins = ["scratch"]', 'deny_plugins = ["engines.scratch"]'])
def test_deny_applies_to_trusted_local_plugins(tmp_path, marker, deny):
    registry = Registry(PluginPolicy.load(local_policy(tmp_path, marker, deny, "trusted = true")))
    with pytest.raises(PluginRefusedError):
        registry.engine_factory("scratch")
    assert not marker.exists()


# -- malformed policy files fail closed ------------------------------------------------------------
def _make(kind: str, path: Path) -> None:
    texts = {
        "policy-int": "policy = 5\n", "aliases-int": "aliases = 5\n", "aliases-group-int": "[aliases]\nengines = 5\n",
        "alias-target-int": "[aliases.engines]\nx = 5\n", "local-int": "local = 5\n",
        "local-paths-int": "[local]\npaths = 5\n", "local-group-str": '[local]\nengines = "x:y"\n',
        "local-target-list": "[local.engines]\nx = [1]\n", "mode-int": "[policy]\nmode = 5\n",
        "mode-list": "[policy]\nmode = []\n", "allow-nested": "[policy]\nallow_plugins = [[1]]\n",
        "override-str": '[policy]\noverride_builtins = "yes"\n', "trusted-int": "[local]\ntrusted = 1\n",
        "invalid-toml": "[policy\nmode = ", "deep-arrays": "x = " + "[" * 5000 + "]" * 5000 + "\n",
        "deep-tables": "x = " + "{a = " * 3000 + "1" + "}" * 3000 + "\n", "huge": "# " + "x" * 200_000 + "\n",
        # tomllib is quadratic in key depth: unchecked, each of these takes seconds to minutes.
        "deep-dotted-key": ".".join(["a"] * 30_000) + " = 1\n", "deep-header": "[" + ".".join(["a"] * 30_000) + "]\n",
    }
    if kind in texts:
        path.write_text(texts[kind])
    elif kind == "invalid-utf8":
        path.write_bytes(b'[policy]\nmode = "open\xff\xfe"\n')
    elif kind == "directory":
        path.mkdir()
    elif kind == "dangling-symlink":
        path.symlink_to(path.parent / "gone.toml")
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "unreadable":
        path.write_text('[policy]\nmode = "allowlist"\n')
        path.chmod(0)
    else:
        raise AssertionError(kind)


MALFORMED = ["policy-int", "aliases-int", "aliases-group-int", "alias-target-int", "local-int", "local-paths-int",
             "local-group-str", "local-target-list", "mode-int", "mode-list", "allow-nested", "override-str",
             "trusted-int", "invalid-toml", "deep-arrays", "deep-tables", "deep-dotted-key", "deep-header", "huge",
             "invalid-utf8", "directory", "dangling-symlink", "fifo", "unreadable"]


def _skip_if_root(kind: str) -> None:
    if kind == "unreadable" and os.geteuid() == 0:
        pytest.skip("root reads any file")


@pytest.mark.parametrize("kind", MALFORMED)
def test_malformed_policy_next_to_the_job_is_a_config_error(tmp_path, kind):
    _skip_if_root(kind)
    job = job_file(tmp_path / "job")
    _make(kind, job.parent / "plugins.toml")
    with pytest.raises(ConfigError) as info:
        load_job_config(job)
    assert str(job.parent / "plugins.toml") in str(info.value)
    assert info.value.hint


@pytest.mark.parametrize("kind", ["policy-int", "invalid-utf8", "directory", "dangling-symlink", "deep-dotted-key"])
@pytest.mark.parametrize("how", ["env", "explicit", "job.plugins"])
def test_malformed_policy_fails_closed_however_it_is_named(tmp_path, monkeypatch, kind, how):
    job = job_file(tmp_path / "job", extra='plugins = "mine.toml"' if how == "job.plugins" else "")
    bad = job.parent / "mine.toml"
    _make(kind, bad)
    if how == "env":
        monkeypatch.setenv(ENV_VAR, str(bad))
    with pytest.raises(ConfigError) as info:
        load_job_config(job, plugins=bad if how == "explicit" else None)
    assert str(bad) in str(info.value)


def test_malformed_policy_cli_reports_the_file_without_traceback(tmp_path):
    bad = tmp_path / "plugins.toml"
    bad.write_bytes(b"aliases = 5\n")
    env = dict(os.environ, **{ENV_VAR: str(bad)})
    result = subprocess.run([sys.executable, "-m", "localstate", "plugins"], capture_output=True, text=True,
                            cwd=tmp_path, env=env)
    assert result.returncode == 1
    assert str(bad) in result.stderr and "aliases" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize("value", ['"missing.toml"', '"../plugins.toml"', '"/etc/hostname"', '"link.toml"',
                                   '5', '""'])
def test_job_policy_must_be_a_file_inside_the_job_folder(tmp_path, value):
    (tmp_path / "plugins.toml").write_text('[policy]\nmode = "open"\n')
    job = job_file(tmp_path / "job", extra=f"plugins = {value}")
    (job.parent / "link.toml").symlink_to(tmp_path / "plugins.toml")
    with pytest.raises(ConfigError) as info:
        load_job_config(job)
    assert "job.plugins" in [p.path for p in info.value.problems]


# -- precedence ------------------------------------------------------------------------------------
@pytest.fixture
def layered(tmp_path):
    """Four distinguishable policies: operator env, operator flag, job.plugins and the job folder's."""
    files = {}
    for name in ("env", "flag", "named", "folder"):
        files[name] = tmp_path / ("job" if name in ("named", "folder") else "ops") / f"{name}.toml"
        files[name].parent.mkdir(exist_ok=True)
        files[name].write_text(f'[policy]\ndeny_plugins = ["{name}-marker"]\n')
    files["folder"] = files["folder"].rename(files["folder"].with_name("plugins.toml"))
    return files


def governing(job: Path, **kwargs) -> str:
    return load_job_config(job, **kwargs).policy.source


def test_precedence_operator_beats_job_beats_folder_beats_default(tmp_path, layered, monkeypatch):
    named = job_file(tmp_path / "job", extra='plugins = "named.toml"')
    assert governing(named) == str(layered["named"])
    plain = tmp_path / "job" / "plain.toml"
    plain.write_text(JOB.format(engine="kv", extra=""))
    assert governing(plain) == str(layered["folder"])
    monkeypatch.setenv(ENV_VAR, str(layered["env"]))
    assert governing(named) == governing(plain) == str(layered["env"])
    assert governing(named, plugins=layered["flag"]) == str(layered["flag"])
    monkeypatch.delenv(ENV_VAR)
    layered["folder"].unlink()
    assert governing(plain) is None


def test_current_directory_is_irrelevant(tmp_path, layered, monkeypatch):
    job = job_file(tmp_path / "job")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "plugins.toml").write_text('[policy]\nmode = "allowlist"\n')
    sources = set()
    for cwd in (tmp_path, elsewhere, job.parent, Path("/")):
        monkeypatch.chdir(cwd)
        sources.add(governing(job))
    assert sources == {str(layered["folder"])}
    monkeypatch.chdir(elsewhere)  # a dict parsed in code has no job folder: the cwd's file is not used
    data = {"job": {"name": "j", "task": "m:T"}, "stores": {}}
    assert parse_job_config(data).policy.source is None
    assert locate_policy(job_dir=None).origin == "default"


def test_policy_ships_to_executors_as_an_equal_value(tmp_path, layered):
    policy = load_job_config(job_file(tmp_path / "job")).policy
    shipped = pickle.loads(pickle.dumps(policy))
    assert shipped == policy and hash(shipped) == hash(policy) and shipped.source == policy.source


def test_plugins_command_shows_the_policy_of_the_named_job(tmp_path, evil_site, marker):
    job = job_file(tmp_path / "job", engine="evil")  # blocked below: the listing must still work
    (job.parent / "plugins.toml").write_text('[policy]\nmode = "allowlist"\n')
    env = {k: v for k, v in os.environ.items() if k != ENV_VAR}
    env["PYTHONPATH"] = os.pathsep.join([str(evil_site), env.get("PYTHONPATH", "")])
    result = subprocess.run([sys.executable, "-m", "localstate", "plugins", str(job)], capture_output=True,
                            text=True, cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stderr
    assert f"policy: {job.parent / 'plugins.toml'} (chosen by job folder)" in result.stdout
    evil = [line for line in result.stdout.splitlines() if line.split()[:2] == ["engines", "evil"]]
    assert evil and "blocked" in evil[0] and "Evil_Plugin" in evil[0]
    assert not marker.exists()


def test_deny_applies_to_an_alias_name_and_to_its_target(tmp_path):
    for deny in ('"keyvalue"', '"engines.kv"'):
        path = tmp_path / "p.toml"
        path.write_text(f'[policy]\ndeny_plugins = [{deny}]\n[aliases.engines]\nkeyvalue = "kv"\n')
        with pytest.raises(PluginRefusedError):
            Registry(PluginPolicy.load(path)).engine_factory("keyvalue")
