"""Third-party plugins: a distribution built and installed by the test registers an engine through
the entry point; policy blocks and allows it; broken, wrong-kind and old-API plugins are refused
clearly and do not affect other plugins."""

import importlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from localstate.core.config import parse_job_config
from localstate.core.policy import PluginPolicy
from localstate.core.registry import Registry
from localstate.core.task import StreamTask
from localstate.testing.driver import TaskTestDriver
from localstate.errors import ConfigError, PluginLoadError, PluginNotFoundError, PluginRefusedError

DIST = Path(__file__).parent / "acme_dist"


@pytest.fixture(scope="module")
def acme_site(tmp_path_factory):
    """Build the throwaway distribution and install it into a directory on sys.path."""
    source = tmp_path_factory.mktemp("acme-src")
    shutil.copytree(DIST, source, dirs_exist_ok=True)
    site = tmp_path_factory.mktemp("acme-site")
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                    "--target", str(site), str(source)], check=True)
    sys.path.insert(0, str(site))
    importlib.invalidate_caches()
    yield site
    sys.path.remove(str(site))
    for name in [m for m in sys.modules if m.startswith("acme_dict")]:
        del sys.modules[name]
    importlib.invalidate_caches()


def write_policy(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_installed_plugin_is_discovered_with_its_distribution(acme_site):
    infos = {i.name: i for i in Registry(PluginPolicy()).available("engines")}
    assert infos["acme-dict"].distribution == "acme-localstate-dict"
    assert infos["acme-dict"].version == "1.2.3"
    assert infos["kv"].distribution == "localstate"  # built-ins come through the same entry points


def test_job_selects_third_party_engine_per_store_and_it_is_fault_tolerant(acme_site, tmp_path):
    class Remember(StreamTask):
        def init(self, context):
            self.seen, self.counts = context.store("seen"), context.store("counts")

        def process(self, envelope, collector, coordinator):
            self.seen.put(envelope.key, envelope.value)
            self.counts.put(envelope.key, (self.counts.get(envelope.key) or 0) + 1)

    stores = {"seen": {"engine": "acme-dict", "initial_capacity": 8, "key_serde": "string", "value_serde": "json"},
              "counts": {"engine": "kv", "backend": "memory", "key_serde": "string", "value_serde": "int"}}
    with TaskTestDriver(Remember, stores=stores, state_dir=tmp_path) as driver:
        assert type(driver.store("seen")).__module__ == "acme_dict"
        driver.send("in", "a", {"n": 1})
        driver.send("in", "b", {"n": 2})
        driver.commit()
        driver.send("in", "a", {"n": 3})  # not committed: lost by the crash, then re-delivered
        driver.crash()
        driver.restart()
        assert driver.store("seen").get("a") == {"n": 3}
        assert driver.store("seen").get("b") == {"n": 2}
        assert driver.store("counts").get("a") == 2


def test_unknown_option_of_third_party_engine_names_the_path(acme_site):
    data = {"job": {"name": "j", "task": "m:T"}, "stores": {"s": {"engine": "acme-dict", "initial_capacit": 1}}}
    with pytest.raises(ConfigError) as info:
        parse_job_config(data)
    assert [p.path for p in info.value.problems] == ["stores.s.initial_capacit"]


def test_policy_blocks_and_allows_the_plugin(acme_site, tmp_path):
    locked = write_policy(tmp_path / "plugins.toml", '[policy]\nmode = "allowlist"\n')
    registry = Registry(PluginPolicy.load(locked))
    with pytest.raises(PluginRefusedError) as info:
        registry.engine_factory("acme-dict")
    assert "acme-localstate-dict" in str(info.value) and "allowlist" in str(info.value)
    registry.engine_factory("kv")  # built-ins stay allowed

    allowed = write_policy(tmp_path / "allowed.toml",
                           '[policy]\nmode = "allowlist"\nallow_distributions = ["acme-localstate-dict"]\n')
    assert Registry(PluginPolicy.load(allowed)).engine_factory("acme-dict").description == "in-memory dict (acme)"

    denied = write_policy(tmp_path / "denied.toml", '[policy]\ndeny_plugins = ["engines.acme-dict"]\n')
    with pytest.raises(PluginRefusedError):
        Registry(PluginPolicy.load(denied)).engine_factory("acme-dict")


def test_policy_blocks_in_job_validation_without_breaking_other_stores(acme_site, tmp_path):
    policy = write_policy(tmp_path / "plugins.toml", '[policy]\nmode = "allowlist"\n')
    data = {"job": {"name": "j", "task": "m:T"},
            "stores": {"a": {"engine": "acme-dict"}, "b": {"engine": "kv", "backend": "memory"}}}
    with pytest.raises(ConfigError) as info:
        parse_job_config(data, plugins=policy)
    assert [p.path for p in info.value.problems] == ["stores.a.engine"]
    assert "blocked" in info.value.problems[0].message


def test_broken_wrong_kind_and_old_api_plugins_are_refused_clearly(acme_site):
    registry = Registry(PluginPolicy())
    with pytest.raises(PluginLoadError) as info:
        registry.engine_factory("acme-broken")
    text = str(info.value)
    assert "acme-broken" in text and "acme-localstate-dict" in text and "1.2.3" in text and "libacme.so" in text
    with pytest.raises(PluginRefusedError) as info:
        registry.engine_factory("acme-wrongkind")
    assert "not a StorageEngineFactory" in str(info.value)
    with pytest.raises(PluginRefusedError) as info:
        registry.engine_factory("acme-oldapi")
    assert "plugin API version 0" in str(info.value)
    # The others still load.
    assert registry.engine_factory("acme-dict") is not None
    assert registry.engine_factory("kv") is not None


def test_unknown_engine_name_lists_names_with_did_you_mean(acme_site):
    with pytest.raises(PluginNotFoundError) as info:
        Registry(PluginPolicy()).engine_factory("acme-dikt")
    assert "did you mean 'acme-dict'" in str(info.value)


def test_plugins_cli_lists_status_and_reason(acme_site, tmp_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(acme_site), os.environ.get("PYTHONPATH", "")]))
    env["LOCALSTATE_PLUGINS"] = str(write_policy(tmp_path / "p.toml", '[policy]\ndeny_plugins = ["acme-oldapi"]\n'))
    result = subprocess.run([sys.executable, "-m", "localstate", "plugins"], capture_output=True, text=True,
                            env=env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    lines = {line.split()[1]: line for line in result.stdout.splitlines() if line.startswith("engines")}
    assert "allowed" in lines["acme-dict"] and "acme-localstate-dict" in lines["acme-dict"] and "1.2.3" in lines["acme-dict"]
    assert "broken" in lines["acme-broken"] and "libacme.so" in lines["acme-broken"]
    assert "broken" in lines["acme-wrongkind"]
    assert "blocked" in lines["acme-oldapi"] and "denied" in lines["acme-oldapi"]


def test_local_development_plugin_without_packaging(tmp_path):
    plugin_dir = tmp_path / "dev"
    plugin_dir.mkdir()
    (plugin_dir / "scratch_engine.py").write_text(
        (DIST / "acme_dict" / "__init__.py").read_text().replace("(acme)", "(scratch)"))
    policy = write_policy(tmp_path / "plugins.toml",
                          '[local]\npaths = ["dev"]\n[local.engines]\nscratch = "scratch_engine:DictEngineFactory"\n'
                          '[aliases.engines]\nkeyvalue = "kv"\n')
    registry = Registry(PluginPolicy.load(policy))
    assert registry.engine_factory("scratch").description == "in-memory dict (scratch)"
    assert registry.engine_factory("keyvalue").__class__.__name__ == "KeyValueEngineFactory"


def test_bad_policy_file_reports_every_problem(tmp_path):
    policy = write_policy(tmp_path / "plugins.toml",
                          '[policy]\nmode = "lax"\nallow_plugins = "x"\n[local.engines]\nbad = "no-colon"\n')
    with pytest.raises(ConfigError) as info:
        PluginPolicy.load(policy)
    assert {p.path for p in info.value.problems} == {"policy.mode", "policy.allow_plugins", "local.engines.bad"}
