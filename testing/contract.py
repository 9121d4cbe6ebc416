"""The storage-engine contract suite: checks an engine against every bullet of the
:class:`~localstate.core.engine.StorageEngine` docstring, in-process and under SIGKILL.

An engine author describes one engine configuration with an :class:`EngineAdapter` (factory,
options, serdes, a random change through the engine's own API, and the engine's whole logical state
as a plain comparable value) and runs the checks with pytest by subclassing :class:`ContractSuite`
(see ``docs/contract.md``). Every check can also be called as a plain function.

The checks (each one a function ``check_*(adapter, directory, seed)``):

1. :func:`check_flush_reopen` - after ``flush()``, a reopened engine reports ``local_offset() ==``
   the changelog end and shows the same state (``None`` and an empty state for adapters that declare
   ``persistent = False``, such as in-memory backends).
2. :func:`check_compactable` - keeping only the last record per key (with or without the
   tombstones) and restoring it into a fresh engine in an empty directory gives the same state.
3. :func:`check_restore` - restore applies records in order (last record wins, also across several
   ``restore`` calls), tombstones delete, restore appends nothing to the changelog, and the restored
   state is durable after the next ``flush()``.
4. :func:`check_close_discards` - ``close()`` without ``flush()`` discards unflushed changes.
5. :func:`check_local_offset` - at random reopen points (also after the local directory was
   deleted) ``local_offset()`` is None or an offset ``o`` whose replay of ``[o, end)`` gives the
   changelog's state.
6. :func:`check_crash` - one shared child process (``python -m localstate.testing.contract``) applies
   seeded changes with flushes and checkpoints and is SIGKILLed at random moments (some inside
   flush); reopening and :func:`~localstate.runtime.partition.recovery.recover_store` to the last checkpoint
   gives exactly the reference state at that checkpoint.

States are compared only after ``flush()`` or a reopen: the contract says nothing about what the
query API shows of restored records before the next flush (a search index shows them after it).
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import json
import logging
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

from localstate.core.changelog import ChangelogPartition, ChangelogRecord, ChangelogSystem
from localstate.core.engine import StorageEngine, StorageEngineFactory, StoreContext
from localstate.runtime.partition.recovery import recover_store
from localstate.core.serdes import BytesSerde, Serde
from localstate.core.time import SYSTEM_TIME, TimeSource
from localstate.core.registry import Registry

__all__ = [
    "EngineAdapter",
    "EngineHarness",
    "ContractSuite",
    "CHECKS",
    "check_flush_reopen",
    "check_compactable",
    "check_restore",
    "check_close_discards",
    "check_local_offset",
    "check_crash",
    "compacted",
    "op_rng",
]

log = logging.getLogger(__name__)


def op_rng(seed: int, step: int) -> random.Random:
    """The random source of operation ``step`` of a seeded run: the same in every process, so a child
    resumed at ``step`` draws exactly the operations an uninterrupted run draws."""
    return random.Random(f"localstate-contract/{seed}/{step}")


def compacted(records: Iterable[ChangelogRecord], *, tombstones: bool = True) -> list[ChangelogRecord]:
    """The last record per key, in offset order (what log compaction keeps); ``tombstones=False``
    also drops keys whose last record is a tombstone."""
    last = {record.key: record for record in records}
    kept = sorted(last.values(), key=lambda record: record.offset)
    return kept if tombstones else [record for record in kept if record.value is not None]


class EngineAdapter(ABC):
    """How the suite drives one engine configuration. Subclass it once per engine kind.

    Constructor keyword arguments are kept in :attr:`params`; the crash child rebuilds the adapter
    as ``type(adapter)(**adapter.params)`` from the file that defines the class, so params must be
    JSON values and the class must be defined at module level.
    """

    persistent: bool = True
    """Whether local state survives close/reopen. False (memory backends): ``local_offset()`` after a
    reopen is None and the state is empty until the changelog is replayed."""

    store: str = "contract"

    def __init__(self, **params: Any) -> None:
        self.params: dict[str, Any] = dict(params)

    @property
    def name(self) -> str:
        """A readable id (pytest shows it)."""
        args = ",".join(f"{k}={v}" for k, v in sorted(self.params.items()))
        return f"{type(self).__name__}({args})"

    def __repr__(self) -> str:
        return self.name

    @abstractmethod
    def factory(self) -> StorageEngineFactory:
        """The engine's factory (as registered under ``localstate.engines``)."""

    def options(self) -> Mapping[str, Any]:
        """The store's raw option table; validated with the factory like the runtime does."""
        return {}

    def key_serde(self) -> Serde:
        return BytesSerde()

    def value_serde(self) -> Serde:
        return BytesSerde()

    def time_source(self) -> TimeSource:
        """The time the store reads (:attr:`StoreContext.time`): the wall clock unless the adapter
        moves its own (e.g. a ``ManualTime`` to make ttl entries expire)."""
        return SYSTEM_TIME

    @abstractmethod
    def random_op(self, rng: random.Random) -> Any:
        """One random change as a plain value, drawn from ``rng`` only (not from engine state)."""

    @abstractmethod
    def apply(self, engine: StorageEngine, op: Any) -> None:
        """Make the change ``op`` through the engine's own API (put, push, add, ...)."""

    @abstractmethod
    def state(self, engine: StorageEngine) -> Any:
        """The engine's whole logical state as a plain value that compares with ``==``."""

    def expected_state(self, ops: Sequence[Any]) -> Any:
        """Optional model: the state after ``ops`` applied to an empty store, or None (no model)."""
        return None


class EngineHarness:
    """Opens engines of one adapter on one local directory and one changelog, as often as a check
    needs; :meth:`close_all` closes everything it opened."""

    def __init__(self, adapter: EngineAdapter, directory: Path, changelog: ChangelogPartition | None = None) -> None:
        if changelog is None:
            changelog = builtin_changelog("memory").partition(f"{adapter.store}-changelog", 0)
        self.adapter = adapter
        self.directory = Path(directory)
        self.changelog = changelog
        self._factory = adapter.factory()
        self._options = self._factory.validate_options(adapter.store, dict(adapter.options()))
        self._opened: list[StorageEngine] = []

    def open(self) -> StorageEngine:
        self.directory.mkdir(parents=True, exist_ok=True)
        context = StoreContext(job="contract", store=self.adapter.store, partition=0, directory=self.directory,
                               options=self._options, key_serde=self.adapter.key_serde(),
                               value_serde=self.adapter.value_serde(), changelog=self.changelog,
                               time=self.adapter.time_source())
        engine = self._factory.create(context)
        self._opened.append(engine)
        return engine

    def reopen(self, engine: StorageEngine, *, wipe: bool = False) -> StorageEngine:
        """Close ``engine`` without flushing, lose what its changelog writer had not flushed (as a
        crashed process would), optionally delete the local directory, and open a new engine."""
        engine.close()
        if engine in self._opened:  # the contract does not ask close() to be idempotent
            self._opened.remove(engine)
        drop = getattr(self.changelog, "drop_unflushed", None)
        if drop is not None:
            drop()
        if wipe:
            shutil.rmtree(self.directory)
        return self.open()

    def end(self) -> int:
        return self.changelog.end_offset()

    def records(self, end: int | None = None) -> list[ChangelogRecord]:
        return list(self.changelog.read(0, end))

    def close_all(self) -> None:
        for engine in self._opened:
            try:
                engine.close()
            except Exception:  # noqa: BLE001 - cleanup after a failed check must not hide the failure
                log.exception("closing %s failed", self.adapter.name)
        self._opened.clear()

    def __enter__(self) -> "EngineHarness":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close_all()


def _expect(condition: bool, adapter: EngineAdapter, check: str, message: str) -> None:
    if not condition:
        raise AssertionError(f"{adapter.name}: contract violated ({check}): {message}")


def _expect_state(actual: Any, expected: Any, adapter: EngineAdapter, check: str, what: str) -> None:
    if actual != expected:
        raise AssertionError(f"{adapter.name}: contract violated ({check}): {what}\n"
                             f"  actual:   {_short(actual)}\n  expected: {_short(expected)}")


def _short(value: Any, limit: int = 1500) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + f"... ({len(text)} chars)"


class _Dirs:
    """Fresh subdirectories of one check's directory."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self._n = 0

    def __call__(self, label: str) -> Path:
        self._n += 1
        return self.root / f"{self._n:02d}-{label}"


def _memory_log(adapter: EngineAdapter, records: Iterable[ChangelogRecord]) -> ChangelogPartition:
    """A memory changelog holding ``records`` (renumbered from 0, order kept)."""
    changelog = builtin_changelog("memory").partition(f"{adapter.store}-changelog", 0)
    changelog.append_many((record.key, record.value) for record in records)
    changelog.flush()
    return changelog


def _empty_state(adapter: EngineAdapter, directory: Path) -> Any:
    with EngineHarness(adapter, directory) as harness:
        return adapter.state(harness.open())


def _restored_state(adapter: EngineAdapter, directory: Path, records: Sequence[ChangelogRecord]) -> Any:
    """State of a fresh engine in an empty directory after restoring ``records`` and flushing."""
    with EngineHarness(adapter, directory, _memory_log(adapter, records)) as harness:
        engine = harness.open()
        engine.restore(harness.records())
        engine.flush()
        return adapter.state(engine)


class _Run:
    """Applies a seeded sequence of operations to an engine and remembers what was flushed."""

    def __init__(self, adapter: EngineAdapter, harness: EngineHarness, seed: int) -> None:
        self.adapter = adapter
        self.harness = harness
        self.seed = seed
        self.step = 0
        self.ops: list[Any] = []
        self.flushed_ops = 0
        self.model_valid = True
        self.engine = harness.open()
        self.flushed_state = adapter.state(self.engine)
        self.flushed_end = harness.end()

    def apply_ops(self, count: int) -> None:
        for _ in range(count):
            op = self.adapter.random_op(op_rng(self.seed, self.step))
            self.adapter.apply(self.engine, op)
            self.ops.append(op)
            self.step += 1

    def reopen(self, *, wipe: bool = False) -> StorageEngine:
        """Close without flush and reopen: the ops since the last flush are lost (the model follows,
        unless the engine had already logged some of them, e.g. in a spill)."""
        self.engine = self.harness.reopen(self.engine, wipe=wipe)
        if self.harness.end() == self.flushed_end:
            del self.ops[self.flushed_ops:]
        else:
            self.model_valid = False
        return self.engine

    def flush(self, check: str) -> Any:
        self.engine.flush()
        end = self.harness.end()
        drop = getattr(self.harness.changelog, "drop_unflushed", None)
        if drop is not None:  # what flush() appended must be flushed too: nothing may be left to lose
            drop()
            _expect(self.harness.end() == end, self.adapter, check,
                    f"flush() returned with {end - self.harness.end()} changelog record(s) appended but not flushed")
        self.flushed_end = self.harness.end()
        self.flushed_ops = len(self.ops)
        self.flushed_state = self.adapter.state(self.engine)
        expected = self.adapter.expected_state(self.ops) if self.model_valid else None
        if expected is not None:
            _expect_state(self.flushed_state, expected, self.adapter, check, "state after flush differs from the model")
        return self.flushed_state


# ---------------------------------------------------------------------------------------------- checks

def check_flush_reopen(adapter: EngineAdapter, directory: Path, seed: int = 0, ops: int = 45) -> None:
    """(1) After flush() and a reopen: local_offset() is the changelog end and the state is the same."""
    name = "flush then reopen"
    dirs = _Dirs(directory)
    with EngineHarness(adapter, dirs("store")) as harness:
        run = _Run(adapter, harness, seed)
        first = run.engine.local_offset()
        _expect(first in (None, 0), adapter, name, f"a new engine in an empty directory has local_offset {first!r}")
        _expect_state(run.flushed_state, _empty_state(adapter, dirs("empty")), adapter, name,
                      "a new engine in an empty directory is not empty")
        for _ in range(3):
            run.apply_ops(ops // 3)
            state = run.flush(name)
            end = harness.end()
            run.reopen()
            offset = run.engine.local_offset()
            if adapter.persistent:
                _expect(offset == end, adapter, name, f"local_offset() after reopen is {offset!r}, "
                                                      f"the changelog end at the flush was {end}")
            else:
                _expect(offset is None, adapter, name, f"non-persistent engine reports local_offset {offset!r}")
                run.engine.restore(harness.records(end))
                run.engine.flush()
            _expect_state(adapter.state(run.engine), state, adapter, name, "state after reopen differs")


def check_compactable(adapter: EngineAdapter, directory: Path, seed: int = 0, ops: int = 60) -> None:
    """(2) The last record per key (with or without tombstones), restored into a fresh engine in an
    empty directory, gives the same state; the restore logs nothing; the state is durable after flush."""
    name = "compactable changelog"
    dirs = _Dirs(directory)
    with EngineHarness(adapter, dirs("store")) as harness:
        run = _Run(adapter, harness, seed)
        rng = random.Random(seed)
        for _ in range(ops):
            run.apply_ops(1)
            if rng.random() < 0.15:
                run.flush(name)
        state = run.flush(name)
        records = harness.records()
    for tombstones in (True, False):
        kept = compacted(records, tombstones=tombstones)
        with EngineHarness(adapter, dirs("compacted"), _memory_log(adapter, kept)) as fresh:
            engine = fresh.open()
            end = fresh.end()
            engine.restore(fresh.records())
            _expect(fresh.end() == end, adapter, name, f"restore appended {fresh.end() - end} record(s)")
            engine.flush()
            _expect_state(adapter.state(engine), state, adapter, name,
                          f"compacted changelog ({len(kept)} of {len(records)} records, tombstones "
                          f"{'kept' if tombstones else 'dropped'}) restores another state")
            if adapter.persistent:
                offset = engine.local_offset()
                _expect(offset == fresh.end(), adapter, name,
                        f"local_offset() after restore+flush is {offset!r}, changelog end {fresh.end()}")
                engine = fresh.reopen(engine)
                _expect_state(adapter.state(engine), state, adapter, name, "restored state is not durable after flush")


def check_restore(adapter: EngineAdapter, directory: Path, seed: int = 0, ops: int = 60) -> None:
    """(3) Restore: in order, last record wins (also split over several calls), tombstones delete,
    nothing is logged again, and the restored state survives a reopen after the next flush."""
    name = "restore"
    dirs = _Dirs(directory)
    rng = random.Random(seed)
    with EngineHarness(adapter, dirs("store")) as harness:
        run = _Run(adapter, harness, seed)
        for _ in range(4):
            run.apply_ops(ops // 4)
            run.flush(name)
        state = run.flushed_state
        records = harness.records()
        end = harness.end()
        # Rebuild from the shared changelog in an empty directory, in random chunks, like recovery.
        rebuilt = EngineHarness(adapter, dirs("rebuilt"), harness.changelog)
        with rebuilt:
            engine = rebuilt.open()
            cuts = sorted(rng.sample(range(len(records) + 1), min(3, len(records) + 1)))
            for start, stop in zip([0] + cuts, cuts + [len(records)]):
                engine.restore(iter(records[start:stop]))
            _expect(harness.end() == end, adapter, name, f"restore appended {harness.end() - end} record(s)")
            engine.flush()
            _expect(harness.end() == end, adapter, name,
                    f"flush after restore appended {harness.end() - end} record(s) with no change made")
            _expect_state(adapter.state(engine), state, adapter, name, "restore in chunks gives another state")
            engine = rebuilt.reopen(engine)
            if adapter.persistent:
                offset = engine.local_offset()
                _expect(offset == end, adapter, name, f"local_offset() after restore+flush+reopen is {offset!r}, "
                                                      f"expected {end}")
                _expect_state(adapter.state(engine), state, adapter, name, "restored state is not durable after flush")
        # A restore interrupted by close() (no flush): what is local must still be a valid start.
        with EngineHarness(adapter, dirs("interrupted"), harness.changelog) as interrupted:
            engine = interrupted.open()
            engine.restore(iter(records[:len(records) // 2]))
            engine = interrupted.reopen(engine)
            _recover_and_compare(adapter, engine, interrupted, dirs, name + " interrupted by close()", (end, state))
    keys = list(dict.fromkeys(record.key for record in records))
    empty = _empty_state(adapter, dirs("empty"))
    every = [ChangelogRecord(key, None, end + i) for i, key in enumerate(keys)]
    _expect_state(_restored_state(adapter, dirs("all-deleted"), records + every), empty, adapter, name,
                  "tombstones for every key do not leave an empty store")
    doomed = set(rng.sample(keys, len(keys) // 2))
    some = [ChangelogRecord(key, None, end + i) for i, key in enumerate(k for k in keys if k in doomed)]
    survivors = [record for record in compacted(records) if record.key not in doomed]
    _expect_state(_restored_state(adapter, dirs("some-deleted"), records + some),
                  _restored_state(adapter, dirs("survivors"), survivors), adapter, name,
                  f"tombstones for {len(doomed)} of {len(keys)} keys do not delete exactly those keys")


def check_close_discards(adapter: EngineAdapter, directory: Path, seed: int = 0, rounds: int = 3,
                         ops: int = 12) -> None:
    """(4) close() without flush() discards unflushed changes: a reopen shows the last flushed state
    (plus only what the engine had already flushed to the changelog before, e.g. spills)."""
    name = "close discards unflushed changes"
    dirs = _Dirs(directory)
    with EngineHarness(adapter, dirs("store")) as harness:
        run = _Run(adapter, harness, seed)
        for _ in range(rounds):
            run.apply_ops(ops)
            state = run.flush(name)
            end = harness.end()
            run.apply_ops(ops)
            before = harness.end()
            run.reopen()
            _expect(harness.end() <= before, adapter, name,
                    f"close() logged {harness.end() - before} record(s) to the changelog (it must not flush)")
            offset = run.engine.local_offset()
            if harness.end() == end:
                if adapter.persistent:
                    _expect(offset == end, adapter, name, f"local_offset() is {offset!r} after a close without "
                                                          f"flush, the last flush ended the changelog at {end}")
                    _expect_state(adapter.state(run.engine), state, adapter, name,
                                  "unflushed changes survived close()")
                else:
                    _expect(offset is None, adapter, name, f"non-persistent engine reports {offset!r}")
            run.flushed_state = _recover_and_compare(adapter, run.engine, harness, dirs, name, (end, state))
            run.flushed_end = harness.end()


def _recover_and_compare(adapter: EngineAdapter, engine: StorageEngine, harness: EngineHarness, dirs: _Dirs,
                         check: str, known: tuple[int, Any] | None = None) -> Any:
    """recover_store to the changelog end and compare with the changelog's state there: ``known``
    ``(end, state)`` if the caller saw it (the state right after a flush), else a fresh restore of
    the whole changelog (which check_compactable shows to equal the live state)."""
    end = harness.end()
    offset = engine.local_offset()
    _expect(offset is None or 0 <= offset <= end, adapter, check,
            f"local_offset() {offset!r} is outside the changelog [0, {end}]")
    recover_store(engine, harness.changelog, end, label=f"contract {adapter.name}")
    state = adapter.state(engine)
    if known is not None and known[0] == end:
        reference = known[1]
    else:
        reference = _restored_state(adapter, dirs("reference"), harness.records(end))
    _expect_state(state, reference, adapter, check,
                  f"local state at local_offset {offset} plus replay of [{offset}, {end}) is not the changelog's state")
    if adapter.persistent:
        _expect(engine.local_offset() == harness.end(), adapter, check,
                f"after recovery local_offset() is {engine.local_offset()!r}, changelog end {harness.end()}")
    return state


def check_local_offset(adapter: EngineAdapter, directory: Path, seed: int = 0, steps: int = 40) -> None:
    """(5) At random reopen points local_offset() is None or an offset o with local state = changelog
    state at o (+ possibly later records); after the local directory was deleted it is None or 0
    with an empty state."""
    name = "local_offset"
    dirs = _Dirs(directory)
    rng = random.Random(seed)
    empty = _empty_state(adapter, dirs("empty"))
    with EngineHarness(adapter, dirs("store")) as harness:
        run = _Run(adapter, harness, seed)
        for step in range(steps):
            roll = 1.0 if step == steps - 1 else rng.random()  # the last step always wipes
            if roll < 0.7:
                run.apply_ops(1)
            elif roll < 0.85:
                run.flush(name)
            elif roll < 0.95:
                run.reopen()
                run.flushed_state = _recover_and_compare(adapter, run.engine, harness, dirs, name,
                                                         (run.flushed_end, run.flushed_state))
                run.flushed_end = harness.end()
            else:
                run.reopen(wipe=True)
                offset = run.engine.local_offset()
                _expect(offset in (None, 0), adapter, name,
                        f"local_offset() is {offset!r} after the local directory was deleted")
                _expect_state(adapter.state(run.engine), empty, adapter, name,
                              "an engine opened on a deleted directory is not empty")
                run.flushed_state = _recover_and_compare(adapter, run.engine, harness, dirs, name,
                                                         (run.flushed_end, run.flushed_state))
                run.flushed_end = harness.end()


# ---------------------------------------------------------------------------------------------- crash

CHECKPOINT = "checkpoint.json"
_CHILD_HANG_SECONDS = 600


def adapter_spec(adapter: EngineAdapter) -> dict[str, Any]:
    """How the crash child finds ``adapter``: the file defining its class, the class, its params."""
    cls = type(adapter)
    return {"file": inspect.getfile(cls), "module": cls.__module__, "class": cls.__qualname__,
            "params": adapter.params}


def load_adapter(spec: Mapping[str, Any]) -> EngineAdapter:
    """Rebuild an adapter from :func:`adapter_spec` (imports the module, else loads the file)."""
    try:
        module = importlib.import_module(spec["module"])
    except ImportError:
        path = Path(spec["file"])
        name = f"_contract_adapter_{path.stem}"
        module = sys.modules.get(name)  # type: ignore[assignment]
        if module is None:
            sys.path.insert(0, str(path.parent))
            loaded = importlib.util.spec_from_file_location(name, path)
            if loaded is None or loaded.loader is None:
                raise
            module = importlib.util.module_from_spec(loaded)
            sys.modules[name] = module
            loaded.loader.exec_module(module)
    target: Any = module
    for part in spec["class"].split("."):
        target = getattr(target, part)
    return target(**spec["params"])


def _read_checkpoint(workdir: Path) -> dict[str, int]:
    path = workdir / CHECKPOINT
    if not path.exists():
        return {"step": 0, "offset": 0}
    return json.loads(path.read_text())


def _write_checkpoint(workdir: Path, step: int, offset: int) -> None:
    tmp = workdir / (CHECKPOINT + ".tmp")
    with open(tmp, "w") as f:
        json.dump({"step": step, "offset": offset}, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, workdir / CHECKPOINT)


def _file_changelog(workdir: Path, adapter: EngineAdapter) -> ChangelogPartition:
    return builtin_changelog("file", {"path": "changelog"}, workdir).partition(f"{adapter.store}-changelog", 0)


def builtin_changelog(name: str, options: Mapping[str, Any] | None = None,
                      state_dir: Path | None = None) -> ChangelogSystem:
    """A changelog system found by name through the plugin registry (default policy: the built-ins),
    so the suite runs on the very plugins a job gets and the core names none of them."""
    return Registry().changelog_system(name)(dict(options or {}), state_dir or Path("."))


def crash_child(specs: Sequence[Mapping[str, Any]], root: Path, seed: int, flush_every: int, total: int) -> None:
    """The shared crash child. Adapter ``i`` works in ``root/i`` (file changelog, store directory,
    checkpoint file): recover every store to its checkpoint, then apply the seeded ops from the
    checkpointed step to every store, and every ``flush_every`` steps flush and checkpoint each store
    in turn. Prints ``recovering I`` before store I's recovery, ``flushing I N`` before store I's flush, ``checkpointing I N OFFSET`` between its
    flush and its checkpoint write, ``flushed I N OFFSET`` after that, and ``done`` at ``total``."""
    stores = []
    for i, spec in enumerate(specs):
        adapter = load_adapter(spec)
        workdir = root / str(i)
        workdir.mkdir(parents=True, exist_ok=True)
        checkpoint = _read_checkpoint(workdir)
        changelog = _file_changelog(workdir, adapter)
        engine = EngineHarness(adapter, workdir / "store", changelog).open()
        print(f"recovering {i}", flush=True)
        recover_store(engine, changelog, checkpoint["offset"], label=f"contract {adapter.name}")
        stores.append((adapter, workdir, changelog, engine, checkpoint["step"]))
        print(f"recovered {i} {checkpoint['step']} {checkpoint['offset']}", flush=True)
    step = min((store[4] for store in stores), default=total)
    while step < total:
        ops = {}
        for i, (adapter, workdir, changelog, engine, start) in enumerate(stores):
            if step >= start:  # a store checkpointed further than the others skips what it has
                ops[i] = adapter.random_op(op_rng(seed, step))
                adapter.apply(engine, ops[i])
        step += 1
        if step % flush_every == 0 or step == total:
            for i, (adapter, workdir, changelog, engine, start) in enumerate(stores):
                if step <= start:
                    continue
                print(f"flushing {i} {step}", flush=True)
                engine.flush()
                offset = changelog.end_offset()
                print(f"checkpointing {i} {step} {offset}", flush=True)
                _write_checkpoint(workdir, step, offset)
                print(f"flushed {i} {step} {offset}", flush=True)
    print("done", flush=True)
    for _, _, changelog, engine, _ in stores:
        engine.close()
        changelog.close()


class _Reference:
    """The uninterrupted run of the same seeded ops, advanced on demand (steps only grow)."""

    def __init__(self, adapter: EngineAdapter, directory: Path, seed: int) -> None:
        self.adapter = adapter
        self.harness = EngineHarness(adapter, directory)
        self.engine = self.harness.open()
        self.seed = seed
        self.ops: list[Any] = []

    def state_at(self, step: int) -> Any:
        assert step >= len(self.ops), "checkpoints only move forward"
        while len(self.ops) < step:
            op = self.adapter.random_op(op_rng(self.seed, len(self.ops)))
            self.adapter.apply(self.engine, op)
            self.ops.append(op)
        self.engine.flush()
        state = self.adapter.state(self.engine)
        expected = self.adapter.expected_state(self.ops)
        if expected is not None:
            _expect_state(state, expected, self.adapter, "crash", "reference run differs from the model")
        return state


def _run_child(adapters: Sequence[EngineAdapter], root: Path, seed: int, flush_every: int, total: int,
               kill: tuple[str, int, int, float] | None) -> tuple[list[str], bool]:
    """Run the crash child; ``kill = (marker, store, nth, delay)``: SIGKILL it ``delay`` seconds after
    the ``nth`` ``marker`` line of store ``store``. Returns its output lines and whether it was killed.
    Its stderr goes to ``root/child.err`` (a pipe nobody reads could fill and block it)."""
    specs = json.dumps([adapter_spec(adapter) for adapter in adapters])
    command = [sys.executable, "-m", "localstate.testing.contract", specs, str(root), str(seed), str(flush_every),
               str(total)]
    root.mkdir(parents=True, exist_ok=True)
    err_path = root / "child.err"
    lines: list[str] = []
    killed = False
    seen = 0
    with open(err_path, "ab") as err:
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=err, text=True)
        # A hang guard, not a timing assertion: a child stuck for this long is reported as failed.
        guard = threading.Timer(_CHILD_HANG_SECONDS, process.kill)
        guard.start()
        try:
            assert process.stdout is not None
            for line in process.stdout:
                lines.append(line.strip())
                words = line.split()
                if kill is not None and words[:2] == [kill[0], str(kill[1])]:
                    seen += 1
                    if seen == kill[2]:
                        if kill[3]:
                            time.sleep(kill[3])
                        os.kill(process.pid, signal.SIGKILL)
                        killed = True
                        break
        finally:
            guard.cancel()
            if process.poll() is None and not killed:
                process.kill()
            process.wait()
            if process.stdout is not None:
                process.stdout.close()
    if not killed and process.returncode != 0:
        names = ", ".join(adapter.name for adapter in adapters)
        tail = err_path.read_text(errors="replace")[-3000:]
        raise AssertionError(f"crash child for {names} failed (exit {process.returncode}); its stderr "
                             f"({err_path}) ends with:\n{tail}")
    return lines, killed


def _check_recovered(adapter: EngineAdapter, workdir: Path, reference: _Reference, lines: list[str], index: int,
                     context: str) -> int:
    """Reopen store ``index`` after the child ended, recover it to its checkpoint and compare."""
    name = "crash"
    checkpoint = _read_checkpoint(workdir)
    flushed = [int(line.split()[2]) for line in lines if line.startswith(f"flushed {index} ")]
    if flushed:
        _expect(checkpoint["step"] >= flushed[-1], adapter, name,
                f"checkpoint {checkpoint} is behind the child's last completed flush at step {flushed[-1]}")
    changelog = _file_changelog(workdir, adapter)
    harness = EngineHarness(adapter, workdir / "store", changelog)
    try:
        engine = harness.open()
        offset = engine.local_offset()
        end = changelog.end_offset()
        _expect(offset is None or 0 <= offset <= end, adapter, name,
                f"after SIGKILL local_offset() is {offset!r}, the changelog ends at {end}")
        recovery = recover_store(engine, changelog, checkpoint["offset"], label=f"contract {adapter.name}")
        log.info("contract crash %s: %s %s: local offset %s, checkpoint %s, changelog end %s, %s", adapter.name,
                 context, recovery.status, offset, checkpoint, end, "trimmed" if recovery.trimmed else "")
        if adapter.persistent:
            _expect(engine.local_offset() == changelog.end_offset(), adapter, name,
                    f"after recovery local_offset() is {engine.local_offset()!r}, changelog end "
                    f"{changelog.end_offset()}")
        _expect_state(adapter.state(engine), reference.state_at(checkpoint["step"]), adapter, name,
                      f"{context}: recovery to checkpoint {checkpoint} (local_offset was {offset}, changelog end "
                      f"{end}) gives another state than the uninterrupted run at that step")
    finally:
        harness.close_all()
        changelog.close()
    return checkpoint["step"]


def check_crash(adapters: EngineAdapter | Sequence[EngineAdapter], directory: Path, seed: int = 0, kills: int = 3,
                flush_every: int = 5, total: int = 60,
                kill_points: Sequence[tuple[str, int, int, float]] | None = None) -> None:
    """(6) One child process runs all ``adapters`` side by side and is SIGKILLed ``kills`` times at
    random moments (right at or shortly after the start of one store's flush or recovery, or between
    its flush and its checkpoint); after each kill every store, reopened and recovered with recover_store to
    its checkpoint, must show the uninterrupted reference run's state at the checkpointed step.
    The next child recovers from the same directories; a last child runs to the end.

    ``kill_points`` replaces the random kills: ``(marker, store, nth, delay)`` each, SIGKILL
    ``delay`` seconds after the ``nth`` stdout line of the child that starts with ``marker`` and
    names store ``store`` (an engine under test may print its own markers, e.g. inside flush)."""
    if isinstance(adapters, EngineAdapter):
        adapters = [adapters]
    dirs = _Dirs(directory)
    root = dirs("child")
    rng = random.Random(seed)
    references = [_Reference(adapter, dirs(f"reference-{i}"), seed) for i, adapter in enumerate(adapters)]
    try:
        if kill_points is not None:
            kills = len(kill_points)
        for attempt in range(kills + 1):
            kill = None
            if kill_points is not None and attempt < kills:
                kill = tuple(kill_points[attempt])  # type: ignore[assignment]
            elif attempt < kills:
                marker = rng.choice(["flushing", "flushing", "checkpointing", "recovering"])
                kill = (marker, rng.randrange(len(adapters)), 1 if marker == "recovering" else rng.randint(1, 2),
                        rng.choice([0.0, rng.uniform(0, 0.002), rng.uniform(0, 0.02)]))
            lines, killed = _run_child(adapters, root, seed, flush_every, total, kill)
            context = f"after SIGKILL {attempt + 1} ({kill})" if killed else "after a complete run"
            steps = [_check_recovered(adapter, root / str(i), references[i], lines, i, context)
                     for i, adapter in enumerate(adapters)]
            if not killed:
                _expect(steps == [total] * len(adapters), adapters[0], "crash",
                        f"the child ended with checkpoints at steps {steps}, not {total}")
                break
    finally:
        for reference in references:
            reference.harness.close_all()


#: Every check, by name (the crash check runs child processes: slow).
CHECKS: dict[str, Callable[..., None]] = {
    "flush_reopen": check_flush_reopen,
    "compactable": check_compactable,
    "restore": check_restore,
    "close_discards": check_close_discards,
    "local_offset": check_local_offset,
    "crash": check_crash,
}


class ContractSuite:
    """A pytest base class: subclass it as ``Test...`` and provide an ``adapter`` fixture; every
    contract check becomes a test. ``seed`` and ``crash_kills`` are class attributes."""

    seed: int = 0
    crash_kills: int = 3

    def test_flush_reopen(self, adapter: EngineAdapter, tmp_path: Path) -> None:
        check_flush_reopen(adapter, tmp_path, self.seed)

    def test_compactable(self, adapter: EngineAdapter, tmp_path: Path) -> None:
        check_compactable(adapter, tmp_path, self.seed)

    def test_restore(self, adapter: EngineAdapter, tmp_path: Path) -> None:
        check_restore(adapter, tmp_path, self.seed)

    def test_close_discards(self, adapter: EngineAdapter, tmp_path: Path) -> None:
        check_close_discards(adapter, tmp_path, self.seed)

    def test_local_offset(self, adapter: EngineAdapter, tmp_path: Path) -> None:
        check_local_offset(adapter, tmp_path, self.seed)

    def test_crash(self, adapter: EngineAdapter, tmp_path: Path) -> None:
        check_crash(adapter, tmp_path, self.seed, kills=self.crash_kills)


def _main(argv: list[str]) -> int:
    if len(argv) != 5:
        print("usage: python -m localstate.testing.contract ADAPTER_SPECS_JSON ROOT SEED FLUSH_EVERY TOTAL "
              "(the crash child of the engine contract suite)", file=sys.stderr)
        return 2
    crash_child(json.loads(argv[0]), Path(argv[1]), int(argv[2]), int(argv[3]), int(argv[4]))
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))

try:  # the crash check starts child processes: part of the slow set (still run in CI)
    import pytest as _pytest
except ImportError:  # pragma: no cover - the suite is usable without pytest too
    pass
else:
    ContractSuite.test_crash = _pytest.mark.slow(ContractSuite.test_crash)  # type: ignore[method-assign]
