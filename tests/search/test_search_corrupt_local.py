"""A damaged tantivy segment file is local-state corruption: detected by the segment footers'
checksums at open (tantivy reads lazily and would otherwise serve wrong or missing results) and
rebuilt from the changelog with identical results; damage found while reading is a
StoreCorruptError, and the next open rebuilds."""

from __future__ import annotations

import glob
import os
from pathlib import Path

import pytest

from localstate.core.corruption import CORRUPT_MARKER
from localstate.runtime.layout import store_directory
from localstate.core.task import StreamTask
from localstate.testing.driver import TaskTestDriver
from localstate.errors import StoreCorruptError

STORES = {"docs": {"engine": "search", "key_serde": "string",
                   "fields": {"body": {"type": "text", "stored": True}}}}


class Indexer(StreamTask):
    def init(self, context):  # noqa: ANN001
        self.docs = context.store("docs")

    def process(self, envelope, collector, coordinator):  # noqa: ANN001
        self.docs.add(envelope.key, {"body": envelope.value})


def _fill(driver: TaskTestDriver) -> dict[str, str]:
    docs = {f"doc{i}": f"word{i % 7} text number{i} " * 5 for i in range(500)}
    for key, body in docs.items():
        driver.send("in", key, body)
    driver.commit()
    return docs


def _state(driver: TaskTestDriver) -> dict[str, str]:
    store = driver.store("docs")
    return {hit.doc_id: hit.fields["body"] for hit in store.search("text", limit=1000)}


@pytest.mark.parametrize("ext", [".store", ".idx", ".term", ".pos", ".fast", ".fieldnorm"])
def test_damaged_segment_file_is_rebuilt_from_the_changelog(tmp_path: Path, ext: str) -> None:
    with TaskTestDriver(Indexer, stores=STORES, state_dir=tmp_path) as driver:
        docs = _fill(driver)
        assert _state(driver) == docs
        driver.crash()
        directory = store_directory(driver.job, "docs", 0)
        target = Path(glob.glob(str(directory / "tantivy" / f"*{ext}"))[0])
        data = bytearray(target.read_bytes())
        for i in range(len(data) // 2, len(data) // 2 + 8):
            data[i] ^= 0xA5
        target.write_bytes(bytes(data))
        recoveries = driver.restart()
        assert recoveries[0].local_offset in (None, 0) and recoveries[0].replayed == len(docs)  # from scratch
        assert _state(driver) == docs
        assert driver.store("docs").count("word3") == sum("word3 " in body for body in docs.values())


def test_damage_found_while_reading_is_a_store_corrupt_error_and_rebuilt(tmp_path: Path) -> None:
    with TaskTestDriver(Indexer, stores=STORES, state_dir=tmp_path) as driver:
        docs = _fill(driver)
        driver.crash()
        driver.restart()  # verifies the (intact) segments once
        store = driver.store("docs")
        target = Path(glob.glob(str(store_directory(driver.job, "docs", 0) / "tantivy" / "*.store"))[0])
        data = bytearray(target.read_bytes())
        for i in range(len(data) // 2, len(data) // 2 + 64):
            data[i] ^= 0xA5
        with open(target, "r+b") as handle:  # in place: tantivy has the file mapped
            handle.write(bytes(data))
        with pytest.raises(StoreCorruptError):
            for i in range(500):
                store.get(f"doc{i}")
        assert (target.parent / CORRUPT_MARKER).exists()
        recoveries = driver.restart()
        assert recoveries[0].local_offset in (None, 0) and recoveries[0].replayed == len(docs)
        assert _state(driver) == docs
        assert not os.path.exists(target.parent / CORRUPT_MARKER)
