"""Plugin discovery runs once per process (issue #37): validating a job with many stores scans the
installed entry points a bounded number of times, not once per store, and a plugin installed while
the process runs is still found (a new sys.path entry, or an explicit invalidation)."""

from __future__ import annotations

import importlib
import importlib.metadata as metadata
import sys
from pathlib import Path

import pytest

from localstate.core.policy import PluginPolicy, builtin_names, invalidate_discovery
from localstate.core.registry import Registry, registry_for
from localstate.tools.validation import check_job

TASK = ("from localstate import StreamTask\n\n"
        "class T(StreamTask):\n    def process(self, envelope, collector, coordinator):\n        pass\n")


@pytest.fixture
def count_scans(monkeypatch):
    """Count calls of ``importlib.metadata.entry_points`` (each scans every installed distribution)."""
    calls = []
    real = metadata.entry_points

    def counting(*args, **kwargs):
        calls.append((args, kwargs))
        return real(*args, **kwargs)

    monkeypatch.setattr(metadata, "entry_points", counting)
    return calls


def _many_store_job(folder: Path, stores: int) -> Path:
    (folder / "t.py").write_text(TASK)
    (folder / "in").mkdir()
    lines = ['[job]', 'name = "many"', 'task = "t:T"', '[inputs.events]', 'system = "jsonl"', 'path = "in"']
    for index in range(stores):
        lines += [f"[stores.s{index}]", 'engine = "kv"', 'backend = "memory"', 'key_serde = "string"',
                  'value_serde = "json"']
    job = folder / "job.toml"
    job.write_text("\n".join(lines) + "\n")
    return job


@pytest.mark.parametrize("stores", [50, 400])
def test_validating_many_stores_scans_entry_points_a_bounded_number_of_times(tmp_path, count_scans, stores):
    job = _many_store_job(tmp_path, stores)
    invalidate_discovery()  # cold, as a new `localstate validate` process
    check = check_job(job)
    assert check.problems == []
    assert len(check.job.stores) == stores
    assert 1 <= len(count_scans) <= 2, count_scans  # one discovery; not one per store


def test_validating_again_in_the_same_process_scans_nothing(tmp_path, count_scans):
    job = _many_store_job(tmp_path, 20)
    check_job(job)  # puts the job's folder on sys.path (for its task module): the next lookup rescans once
    check_job(job)
    count_scans.clear()
    assert check_job(job).problems == []
    assert count_scans == []


def test_a_new_sys_path_entry_is_discovered_without_invalidation(tmp_path):
    site = tmp_path / "site"
    info = site / "Late_Plugin-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: Late_Plugin\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[localstate.engines]\nlate = late_plugin_mod:Factory\n")
    registry = registry_for(PluginPolicy())
    assert "late" not in registry.names("engines")
    sys.path.insert(0, str(site))
    importlib.invalidate_caches()
    try:
        assert "late" in registry.names("engines")  # the same (cached) registry sees it
    finally:
        sys.path.remove(str(site))
        importlib.invalidate_caches()
    assert "late" not in registry.names("engines")


def test_a_plugin_installed_into_a_directory_already_on_sys_path_needs_invalidation(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    sys.path.insert(0, str(site))
    try:
        registry = Registry(PluginPolicy())
        assert "later" not in registry.names("engines")
        info = site / "Later_Plugin-1.0.dist-info"
        info.mkdir()
        (info / "METADATA").write_text("Metadata-Version: 2.1\nName: Later_Plugin\nVersion: 1.0\n")
        (info / "entry_points.txt").write_text("[localstate.engines]\nlater = later_plugin_mod:Factory\n")
        importlib.invalidate_caches()
        invalidate_discovery()
        assert "later" in registry.names("engines")
        assert "later" not in builtin_names("engines") and "kv" in builtin_names("engines")
    finally:
        sys.path.remove(str(site))
        importlib.invalidate_caches()
