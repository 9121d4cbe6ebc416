"""docs/contract.md's example (a toy third-party engine and its contract test) run for real, the way
an engine author runs it: the two files the page includes (docs/snippets/contract/), run with pytest. Also: the suite
fails on engines that break the contract (each check can fail)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from localstate.testing.contract import (check_close_discards, check_compactable, check_flush_reopen,
                                      check_local_offset, check_restore)

# docs/contract.md includes these two files (``--8<--``).
EXAMPLE = Path(__file__).resolve().parents[2] / "docs" / "snippets" / "contract"


def doc_files(directory: Path) -> dict[str, Path]:
    """Copy the doc's two example files to ``directory``."""
    files = {}
    for name in ("toy_engine.py", "test_toy_contract.py"):
        path = directory / name
        path.write_text((EXAMPLE / name).read_text())
        files[name] = path
    return files


def test_doc_example_passes_the_suite(tmp_path: Path) -> None:
    files = doc_files(tmp_path)
    assert set(files) == {"toy_engine.py", "test_toy_contract.py"}
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_toy_contract.py"],
                            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "6 passed" in result.stdout, result.stdout[-2000:]


# -- the checks catch violations ------------------------------------------------------------------

@pytest.fixture
def toy(tmp_path: Path) -> Any:
    """The doc's example modules, imported."""
    directory = tmp_path / "example"
    directory.mkdir()
    doc_files(directory)
    sys.path.insert(0, str(directory))
    try:
        import test_toy_contract
        import toy_engine
        yield toy_engine, test_toy_contract
    finally:
        sys.path.remove(str(directory))
        sys.modules.pop("toy_engine", None)
        sys.modules.pop("test_toy_contract", None)


def broken_adapter(toy: Any, **overrides: Any) -> Any:
    """The doc's adapter over a toy engine with ``overrides`` (methods) replaced."""
    toy_engine, test_module = toy
    engine_cls = type("BrokenToyEngine", (toy_engine.ToyDictEngine,), overrides)
    factory_cls = type("BrokenToyFactory", (toy_engine.ToyDictFactory,), {"create": lambda self, c: engine_cls(c)})
    adapter_cls = type("BrokenToyAdapter", (test_module.ToyAdapter,), {"factory": lambda self: factory_cls()})
    return adapter_cls()


def relogging_restore(self: Any, records: Any) -> None:
    records = list(records)
    type(self).__mro__[1].restore(self, records)
    self.context.changelog.append_many((r.key, r.value) for r in records)


def flushing_close(self: Any) -> None:
    self.flush()
    type(self).__mro__[1].close(self)


def offset_without_data(self: Any) -> None:
    """Persists the offset but forgets the data changed since the previous flush."""
    type(self).__mro__[1].flush(self)
    saved = json.loads(self.path.read_text())
    saved["data"] = {}
    self.path.write_text(json.dumps(saved))


def appending_put(self: Any, key: Any, value: Any) -> None:
    """A value that accumulates every put: one record per put, not compactable."""
    raw = self.context.key_serde.serialize(key)
    new = self.context.value_serde.serialize(value)
    self.pending[raw] = new
    self.data[raw] = self.data.get(raw, b"") + new


def appending_restore(self: Any, records: Any) -> None:
    for record in records:
        if record.value is None:
            self.data.pop(record.key, None)
        else:
            self.data[record.key] = self.data.get(record.key, b"") + record.value
        self.dirty = True


def appending_items(self: Any) -> list:
    return sorted((k, v) for k, v in self.data.items())


def unflushed_changelog(self: Any) -> None:
    """Appends to the changelog but never flushes it (reports the end offset as if it had)."""
    changelog = self.context.changelog
    changelog.flush = changelog.end_offset  # shadows the method on this instance
    try:
        type(self).__mro__[1].flush(self)
    finally:
        del changelog.flush


def no_tombstone_restore(self: Any, records: Any) -> None:
    for record in records:
        if record.value is not None:
            self.data[record.key] = record.value
        self.dirty = True


@pytest.mark.parametrize("overrides, check, violated", [
    ({"restore": relogging_restore}, check_restore, "restore"),
    ({"close": flushing_close}, check_close_discards, "close discards unflushed changes"),
    ({"flush": offset_without_data}, check_flush_reopen, "flush then reopen"),
    ({"flush": offset_without_data}, check_local_offset, "local_offset"),
    ({"put": appending_put, "restore": appending_restore, "items": appending_items}, check_compactable,
     "compactable changelog"),
    ({"restore": no_tombstone_restore}, check_restore, "restore"),
    ({"flush": unflushed_changelog}, check_flush_reopen, "flush then reopen"),
], ids=["relogging-restore", "flushing-close", "offset-without-data", "offset-without-data-walk",
        "not-compactable", "tombstones-ignored", "changelog-not-flushed"])
def test_checks_catch_violations(toy: Any, tmp_path: Path, overrides: dict, check: Any, violated: str) -> None:
    adapter = broken_adapter(toy, **overrides)
    if "put" in overrides:
        adapter.expected_state = lambda ops: None  # the model is of the correct engine
    with pytest.raises(AssertionError, match=re.escape(f"contract violated ({violated})")):
        check(adapter, tmp_path / "run", seed=0)


def test_correct_toy_engine_passes_in_process(toy: Any, tmp_path: Path) -> None:
    adapter = toy[1].ToyAdapter()
    for i, check in enumerate([check_flush_reopen, check_compactable, check_restore, check_close_discards,
                               check_local_offset]):
        check(adapter, tmp_path / str(i), seed=5)


AHEAD_OF_CHANGELOG = '''
"""A toy engine that makes local state durable before its changelog records (a contract violation
only a crash shows), and prints "early STORE" in that window."""
import time

from test_toy_contract import ToyAdapter
from toy_engine import ToyDictEngine, ToyDictFactory


class AheadEngine(ToyDictEngine):
    def flush(self):
        if not self.pending:
            return super().flush()
        changelog = self.context.changelog
        changelog.append_many(self.pending.items())
        self.pending.clear()
        self.offset = changelog.end_offset()   # counts the records not flushed yet
        self.dirty = True
        saved, real_flush = changelog.flush, changelog.flush
        changelog.flush = lambda: self.offset  # write local state "with" an offset not durable yet
        try:
            super().flush()
        finally:
            changelog.flush = saved
        print("early 0", flush=True)
        time.sleep(10)  # the parent kills the child in this window
        real_flush()


class AheadFactory(ToyDictFactory):
    def create(self, context):
        return AheadEngine(context)


class AheadAdapter(ToyAdapter):
    def factory(self):
        return AheadFactory()
'''


def test_crash_check_catches_local_state_ahead_of_the_changelog(toy: Any, tmp_path: Path) -> None:
    """Only a SIGKILL inside flush shows it: the kill point is the engine's own "early" line."""
    directory = Path(toy[0].__file__).parent
    (directory / "ahead_engine.py").write_text(AHEAD_OF_CHANGELOG)
    from localstate.testing.contract import check_crash, load_adapter
    adapter = load_adapter({"module": "ahead_engine", "file": str(directory / "ahead_engine.py"),
                            "class": "AheadAdapter", "params": {}})
    try:
        with pytest.raises(AssertionError, match=re.escape("contract violated (crash)")) as caught:
            check_crash(adapter, tmp_path / "run", seed=0, kill_points=[("early", 0, 1, 0.0)])
        assert "the changelog ends at 0" in str(caught.value)  # local offset past the durable changelog
    finally:
        sys.modules.pop("ahead_engine", None)
