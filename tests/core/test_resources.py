"""Issue 15 (resources): OS errors at the edges (disk full, read-only file system, missing state
directory, file size limit) are typed errors naming the file with a hint, on checkpoints and their
locks, write_atomic, outputs and store backends; input partitions that are not regular files are
refused with an InputError naming the path.

Disk full and read-only are real: a small tmpfs (remounted read-only where needed). Mounting needs
root and a sandbox that allows it; where it is refused those tests skip with that reason, while the
RLIMIT_FSIZE tests (EFBIG in a child process) exercise the same error paths anywhere."""

from __future__ import annotations

import errno
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from localstate.core.registry import open_backend
from localstate.core.checkpoint import Checkpoint, CheckpointStore
from localstate.core.config import parse_job_config
from localstate.core.fsutil import write_atomic
from localstate.core.stream import open_input, open_output
from localstate.streams.jsonl import write_jsonl
from localstate.errors import (CheckpointError, CheckpointIOError, InputError, LocalStateError, OutputError,
                               OutputIOError, ResourceError, StoreError, StoreIOError)

BACKENDS = ["rocksdb", "lmdb"]


# -- a small real file system --------------------------------------------------------------------------

def _mount(target: Path, size: str) -> str | None:
    """Mount a tmpfs of ``size`` at ``target``; the reason when that is not possible."""
    if os.geteuid() != 0:
        return "mounting a tmpfs needs root"
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(target)],
                          capture_output=True, text=True)
    return None if proc.returncode == 0 else f"tmpfs mount refused: {proc.stderr.strip()}"


class SmallFS:
    """A mounted tmpfs: fill it up, or remount it read-only."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._filler = 0

    def fill(self) -> None:
        """Take every free byte (one filler file per call)."""
        self._filler += 1
        chunk = b"\0" * 4096
        with open(self.root / f".filler-{self._filler}", "wb", buffering=0) as handle:
            try:
                while True:
                    handle.write(chunk)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC
        assert os.statvfs(self.root).f_bavail == 0

    def free(self) -> None:
        for index in range(1, self._filler + 1):
            (self.root / f".filler-{index}").unlink(missing_ok=True)

    def read_only(self, on: bool = True) -> None:
        subprocess.run(["mount", "-o", f"remount,{'ro' if on else 'rw'}", str(self.root)], check=True)


@pytest.fixture
def small_fs(tmp_path):
    root = tmp_path / "fs"
    root.mkdir()
    reason = _mount(root, "4M")
    if reason:
        pytest.skip(reason)
    try:
        yield SmallFS(root)
    finally:
        subprocess.run(["umount", "-l", str(root)], check=False)


def assert_names(error: LocalStateError, path: Path | str) -> None:
    assert str(path) in str(error)
    assert error.hint


# -- write_atomic -------------------------------------------------------------------------------------

def test_write_atomic_on_full_disk_is_typed_and_keeps_the_old_file(small_fs):
    target = small_fs.root / "meta.json"
    write_atomic(target, b"old")
    small_fs.fill()
    with pytest.raises(ResourceError) as info:
        write_atomic(target, b"new" * 10_000)
    assert info.value.errno == errno.ENOSPC
    assert_names(info.value, target)
    assert "disk is full" in info.value.hint
    assert target.read_bytes() == b"old"
    assert [p.name for p in small_fs.root.iterdir() if p.name.endswith(".tmp")] == []


def test_write_atomic_on_read_only_fs_is_typed(small_fs):
    target = small_fs.root / "meta.json"
    write_atomic(target, b"old")
    small_fs.read_only()
    with pytest.raises(ResourceError) as info:
        write_atomic(target, b"new")
    assert info.value.errno == errno.EROFS
    assert_names(info.value, target)


def test_write_atomic_into_missing_directory_is_typed(tmp_path):
    with pytest.raises(ResourceError) as info:
        write_atomic(tmp_path / "gone" / "meta.json", b"x")
    assert info.value.errno == errno.ENOENT


# -- checkpoints and their locks ------------------------------------------------------------------------

def test_checkpoint_save_on_full_disk_keeps_the_previous_checkpoint(small_fs):
    store = CheckpointStore(small_fs.root / "checkpoints")
    store.save(Checkpoint(0, generation=1, inputs={"in": 5}))
    small_fs.fill()
    with pytest.raises(CheckpointIOError) as info:
        store.save(Checkpoint(0, generation=2, inputs={"in": 9, **{f"s{i}": i for i in range(2000)}}))
    assert isinstance(info.value, CheckpointError) and isinstance(info.value, ResourceError)
    assert info.value.errno == errno.ENOSPC
    assert_names(info.value, store.path(0))
    assert store.load(0) == Checkpoint(0, generation=1, inputs={"in": 5})


def test_checkpoint_lock_on_read_only_state_dir_is_typed(small_fs):
    root = small_fs.root / "checkpoints"
    CheckpointStore(root)
    small_fs.read_only()
    store = CheckpointStore(root)  # the directory exists: opening the store needs no write
    with pytest.raises(CheckpointIOError) as info:
        store.lock(0)
    assert info.value.errno == errno.EROFS
    assert_names(info.value, root / "0.lock")
    assert "read-only" in info.value.hint


def test_checkpoint_directory_on_read_only_fs_is_typed(small_fs):
    small_fs.read_only()
    with pytest.raises(CheckpointIOError) as info:
        CheckpointStore(small_fs.root / "state" / "checkpoints")
    assert info.value.errno == errno.EROFS


def test_checkpoint_save_after_state_dir_removed_is_typed(tmp_path):
    store = CheckpointStore(tmp_path / "state" / "checkpoints")
    store.save(Checkpoint(0))
    for child in store.root.iterdir():
        child.unlink()
    store.root.rmdir()
    with pytest.raises(CheckpointIOError) as info:
        store.save(Checkpoint(0, generation=1))
    assert info.value.errno == errno.ENOENT
    assert "does not exist" in info.value.hint


def test_checkpoint_lock_path_is_a_directory_is_typed(tmp_path):
    store = CheckpointStore(tmp_path / "checkpoints")
    (store.root / "0.lock").mkdir()
    with pytest.raises(CheckpointIOError) as info:
        store.lock(0)
    assert info.value.errno == errno.EISDIR


# -- outputs ----------------------------------------------------------------------------------------------

def jsonl_job(tmp_path: Path, out: Path):
    return parse_job_config({"job": {"name": "j", "task": "m:T"},
                             "outputs": {"out": {"system": "jsonl", "path": str(out)}}}, base_dir=tmp_path)


def test_jsonl_output_append_on_full_disk_is_typed(tmp_path, small_fs):
    output = open_output(jsonl_job(tmp_path, small_fs.root / "out"), "out")
    assert output.append(0, [("k", 1)]) == 1
    small_fs.fill()
    with pytest.raises(OutputIOError) as info:
        output.append(0, [(f"k{i}", "v" * 100) for i in range(1000)])
    assert isinstance(info.value, OutputError)
    assert info.value.errno == errno.ENOSPC
    assert_names(info.value, small_fs.root / "out" / "0.jsonl")
    small_fs.free()
    # The rollback to the checkpointed position drops whatever partial line the failure left.
    assert output.truncate(0, 1) == 1
    assert list(output.read(0)) == [("k", 1)]


def test_jsonl_output_on_read_only_fs_is_typed(tmp_path, small_fs):
    output = open_output(jsonl_job(tmp_path, small_fs.root / "out"), "out")
    output.append(0, [("k", 1), ("k", 2)])
    small_fs.read_only()
    with pytest.raises(OutputIOError) as info:
        output.append(0, [("k", 3)])
    assert info.value.errno == errno.EROFS
    with pytest.raises(OutputIOError):
        output.truncate(0, 1)


# -- store backends -------------------------------------------------------------------------------------

def _fill_store(backend) -> None:
    for i in range(10_000):
        backend.write([(f"k{i:05}-{j}".encode(), os.urandom(1000)) for j in range(64)], {b"offset": b"%d" % i})


@pytest.mark.parametrize("kind", BACKENDS)
def test_backend_write_on_full_disk_is_typed(small_fs, kind):
    # A memtable larger than the disk: the synchronous WAL append is what fails. (With a small one,
    # a RocksDB background flush that fails for space can stall the writer: a known limit.)
    backend = open_backend(kind, small_fs.root / kind, {"write_buffer_size": "64MB"}, store="counts",
                           partition=3)
    with pytest.raises(StoreIOError) as info:
        _fill_store(backend)
    try:
        backend.close()
    except StoreIOError as exc:  # RocksDB's close flushes its memtable, which may fail the same way
        assert exc.errno in (errno.ENOSPC, errno.EIO)
    error = info.value
    assert isinstance(error, StoreError) and isinstance(error, ResourceError)
    # LMDB reports a failed write of its pages as EIO; RocksDB says ENOSPC.
    assert error.errno in (errno.ENOSPC, errno.EIO)
    assert error.context["store"] == "counts" and error.context["partition"] == 3
    assert_names(error, small_fs.root / kind)


@pytest.mark.parametrize("kind", BACKENDS)
def test_backend_open_on_read_only_fs_is_typed_and_keeps_local_state(small_fs, kind):
    backend = open_backend(kind, small_fs.root / kind, {}, store="counts", partition=0)
    backend.write([(b"a", b"1")], {b"offset": b"1"})
    backend.close()
    files = sorted(p.name for p in (small_fs.root / kind / kind).iterdir())
    small_fs.read_only()
    with pytest.raises(StoreIOError) as info:
        open_backend(kind, small_fs.root / kind, {}, store="counts", partition=0)
    assert info.value.errno == errno.EROFS
    assert "read-only" in info.value.hint
    small_fs.read_only(False)
    # Not mistaken for corruption: the local state was not discarded.
    assert sorted(p.name for p in (small_fs.root / kind / kind).iterdir()) == files
    reopened = open_backend(kind, small_fs.root / kind, {}, store="counts", partition=0)
    try:
        assert reopened.get(b"a") == b"1"
    finally:
        reopened.close()


@pytest.mark.parametrize("kind", BACKENDS)
def test_backend_open_on_full_disk_is_typed(small_fs, kind):
    small_fs.fill()
    with pytest.raises(StoreIOError) as info:
        open_backend(kind, small_fs.root / kind, {}, store="counts", partition=0)
    assert info.value.errno in (errno.ENOSPC, errno.EIO)


# -- a whole task instance on a full disk ---------------------------------------------------------------

CHILD = textwrap.dedent("""
    import json, resource, signal, sys
    from localstate.core.config import parse_job_config
    from localstate.runtime.layout import open_changelog_system
    from localstate.runtime.partition.instance import TaskInstance
    from localstate.core.task import Envelope, StreamTask
    from localstate.errors import LocalStateError

    class Put(StreamTask):
        def init(self, context):
            self.store = context.store("kv")
        def process(self, envelope, collector, coordinator):
            self.store.put(envelope.key, envelope.value)

    state, backend, limit, records = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    job = parse_job_config({"job": {"name": "j", "task": "x:Put", "commit_every": 50, "commit_interval": 10 ** 6,
                                    "state_dir": state},
                            "stores": {"kv": {"engine": "kv", "backend": backend, "key_serde": "string",
                                              "value_serde": "string"}}})
    instance = TaskInstance(job, 0, open_changelog_system(job), task_factory=Put)
    instance.open()
    if limit:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # writes past the limit fail with EFBIG instead
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    try:
        for i in range(instance.position("input"), records):
            instance.process(Envelope("input", 0, i, f"k{i % 500}", "v%d-" % i + "x" * 2000))
        instance.close(commit=True)
        print(json.dumps({"done": True, "position": instance.position("input")}))
    except LocalStateError as exc:
        print(json.dumps({"error": type(exc).__name__, "errno": getattr(exc, "errno", None), "text": str(exc)}))
""")


def run_child(state: Path, backend: str, limit: int, records: int) -> dict:
    proc = subprocess.run([sys.executable, "-c", CHILD, str(state), backend, str(limit), str(records)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("backend", BACKENDS)
def test_file_size_limit_while_processing_is_typed_and_the_job_resumes(tmp_path, backend):
    """RLIMIT_FSIZE makes the changelog, the store files or the checkpoint fail with EFBIG: whichever
    is first, the error is typed; with the limit lifted the job resumes from its checkpoint and ends
    with every record applied."""
    state = tmp_path / "state"
    failed = run_child(state, backend, 256 << 10, 3000)
    assert "error" in failed, failed
    # Whichever edge hits the limit first: the changelog (ChangelogError), RocksDB (EFBIG) or LMDB,
    # which reports any failed page write as EIO.
    assert failed["error"] in ("ChangelogError", "StoreIOError", "CheckpointIOError"), failed
    assert failed["errno"] in (errno.EFBIG, errno.EIO) or "File too large" in failed["text"], failed
    done = run_child(state, backend, 0, 3000)
    assert done == {"done": True, "position": 3000}


@pytest.mark.parametrize("what", ["write_atomic", "checkpoint", "jsonl"])
def test_file_size_limit_on_each_edge_is_typed(tmp_path, what):
    script = textwrap.dedent(f"""
        import resource, signal, sys
        from pathlib import Path
        from localstate.errors import ResourceError
        root = Path(sys.argv[1])
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (1000, 1000))
        try:
            if {what!r} == "write_atomic":
                from localstate.core.fsutil import write_atomic
                write_atomic(root / "f", b"x" * 5000)
            elif {what!r} == "checkpoint":
                from localstate.core.checkpoint import Checkpoint, CheckpointStore
                CheckpointStore(root).save(Checkpoint(0, inputs={{f"s{{i}}": i for i in range(500)}}))
            else:
                from localstate.core.config import parse_job_config
                from localstate.core.stream import open_output
                job = parse_job_config({{"job": {{"name": "j", "task": "m:T"}},
                                         "outputs": {{"o": {{"system": "jsonl", "path": str(root)}}}}}})
                open_output(job, "o").append(0, [("k", "v" * 5000)])
        except ResourceError as exc:
            print(type(exc).__name__, exc.errno)
    """)
    proc = subprocess.run([sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    name, code = proc.stdout.split()
    assert int(code) == errno.EFBIG
    assert name == {"write_atomic": "ResourceError", "checkpoint": "CheckpointIOError",
                    "jsonl": "OutputIOError"}[what]


# -- input partitions that are not regular files ---------------------------------------------------------

def jsonl_input_job(tmp_path: Path):
    return parse_job_config({"job": {"name": "j", "task": "m:T", "partitions": 2},
                             "inputs": {"in": {"system": "jsonl", "path": str(tmp_path / "in")}}})


def make_fifo(path: Path) -> None:
    os.mkfifo(path)


def make_dev_zero_symlink(path: Path) -> None:
    path.symlink_to("/dev/zero")


def make_dev_null_symlink(path: Path) -> None:
    path.symlink_to("/dev/null")


def make_directory(path: Path) -> None:
    path.mkdir()


def make_socket(path: Path) -> None:
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(path))
    sock.close()


NOT_REGULAR = [make_fifo, make_dev_zero_symlink, make_dev_null_symlink, make_directory, make_socket]


@pytest.mark.parametrize("make", NOT_REGULAR, ids=lambda f: f.__name__)
def test_jsonl_input_partition_that_is_not_a_regular_file_is_refused(tmp_path, make):
    (tmp_path / "in").mkdir()
    write_jsonl(tmp_path / "in", 0, [{"key": "a", "value": 1}])
    make(tmp_path / "in" / "1.jsonl")
    source = open_input(jsonl_input_job(tmp_path), "in")
    assert source.end_offset(0) == 1  # the regular partition still reads
    for call in (lambda: source.end_offset(1), lambda: list(source.read(1, 0, 10))):
        with pytest.raises(InputError) as info:
            call()  # must neither block (FIFO) nor read forever (/dev/zero)
        assert_names(info.value, tmp_path / "in" / "1.jsonl")
        assert info.value.context["partition"] == 1 and info.value.context["stream"] == "in"
        assert "regular file" in str(info.value)


def test_jsonl_input_symlink_to_a_regular_file_is_fine(tmp_path):
    write_jsonl(tmp_path / "data", 0, [{"key": "a", "value": 1}, {"key": "b", "value": 2}])
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "0.jsonl").symlink_to(tmp_path / "data" / "0.jsonl")
    source = open_input(jsonl_input_job(tmp_path), "in")
    assert source.end_offset(0) == 2
    assert [(r.key, r.value) for r in source.read(0, 0, 2)] == [("a", 1), ("b", 2)]
    assert source.end_offset(1) == 0  # absent partition: empty, as before


def test_jsonl_input_path_that_is_a_file_is_refused(tmp_path):
    (tmp_path / "in").write_text("not a directory")
    source = open_input(jsonl_input_job(tmp_path), "in")
    with pytest.raises(InputError) as info:
        source.end_offset(0)
    assert "in" in str(info.value)


def filelog_input_job(tmp_path: Path):
    return parse_job_config({"job": {"name": "j", "task": "m:T"},
                             "inputs": {"in": {"system": "file", "path": str(tmp_path / "logs")}}},
                            base_dir=tmp_path)


@pytest.mark.parametrize("make", [make_fifo, make_dev_zero_symlink, make_socket], ids=lambda f: f.__name__)
def test_file_log_input_segment_that_is_not_a_regular_file_is_refused(tmp_path, make):
    from localstate.changelog.file.format import segment_name

    directory = tmp_path / "logs" / "in" / "0"
    directory.mkdir(parents=True)
    make(directory / segment_name(0))
    source = open_input(filelog_input_job(tmp_path), "in")
    with pytest.raises(InputError) as info:
        source.end_offset(0)
    assert_names(info.value, directory / segment_name(0))
    with pytest.raises(InputError):
        list(source.read(0, 0, 5))


@pytest.mark.parametrize("make", [make_fifo, make_dev_zero_symlink, lambda p: p.write_text("x")],
                         ids=["fifo", "dev_zero", "regular_file"])
def test_file_log_input_partition_that_is_not_a_directory_is_refused(tmp_path, make):
    (tmp_path / "logs" / "in").mkdir(parents=True)
    make(tmp_path / "logs" / "in" / "0")
    source = open_input(filelog_input_job(tmp_path), "in")
    with pytest.raises(InputError, match="not a directory|outside the input path"):
        source.end_offset(0)


def test_no_sigkill_from_a_stray_crash_spec_in_a_task_instance(tmp_path):
    """The crash hook inside the real commit protocol: without the test switch a production-like
    process (no LOCALSTATE_TESTING) runs to the end."""
    env = {k: v for k, v in os.environ.items() if k != "LOCALSTATE_TESTING"}
    env["LOCALSTATE_CRASH_AT"] = "after_flush:1"
    proc = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path / "s"), "rocksdb", "0", "200"], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode != -signal.SIGKILL, proc.stderr
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == {"done": True, "position": 200}


def test_spark_partition_claim_on_read_only_state_dir_is_typed(small_fs):
    from localstate.runtime.spark.affinity.kept import claim

    claims = small_fs.root / "claims" / "run"
    assert claim(claims, [0, 1], 0, None) == 0
    small_fs.read_only()
    assert claim(claims, [0, 1], 0, None) == 0  # a retried attempt finds its claim without writing
    with pytest.raises(CheckpointIOError) as info:
        claim(claims, [0, 1], 1, None)
    assert info.value.errno == errno.EROFS
    assert_names(info.value, claims)


def test_dataframe_row_exchange_on_full_or_read_only_state_dir_is_typed(small_fs):
    """A DataFrame batch's row exchange (runtime/spark/affinity/exchange.py) on a full, then read-only, state
    directory: CheckpointIOError naming the exchange directory, never a bare OSError."""
    import pyarrow as pa

    from localstate.runtime.spark.affinity.exchange import RowExchange

    directory = small_fs.root / "exchange" / "batch"
    directory.mkdir(parents=True)
    rows = pa.table({"key": ["k" * 1000] * 2000})  # ~2 MB: more than the full file system has left
    exchange = RowExchange(directory, 0)
    assert exchange.announce(0, 1)  # keeps partition 1: will offer its rows
    small_fs.fill()
    with pytest.raises(CheckpointIOError) as info:
        list(exchange.assignments({0: rows}, 1, True))
    assert info.value.errno == errno.ENOSPC
    assert_names(info.value, directory)
    small_fs.free()
    small_fs.read_only()
    with pytest.raises(CheckpointIOError) as info:
        RowExchange(directory, 1).announce(1, 0)
    assert info.value.errno == errno.EROFS
    assert_names(info.value, directory)


def test_resource_errors_keep_errno_and_context_across_pickling():
    import pickle

    error = CheckpointIOError("cannot write x", errno=errno.ENOSPC, hint="free space", path="/x", partition=2)
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is CheckpointIOError and copy.errno == errno.ENOSPC
    assert copy.context == {"path": "/x", "partition": 2} and str(copy) == str(error)


def test_checkpoint_delete_on_read_only_fs_is_typed(small_fs):
    store = CheckpointStore(small_fs.root / "checkpoints")
    store.save(Checkpoint(0))
    small_fs.read_only()
    with pytest.raises(CheckpointIOError) as info:
        store.delete(0)
    assert info.value.errno == errno.EROFS
    assert store.load(0) == Checkpoint(0)


@pytest.mark.parametrize("make", [make_fifo, make_dev_zero_symlink, make_directory, make_socket],
                         ids=lambda f: f.__name__)
def test_jsonl_output_partition_that_is_not_a_regular_file_is_refused(tmp_path, make):
    out = tmp_path / "out"
    out.mkdir()
    make(out / "0.jsonl")
    output = open_output(jsonl_job(tmp_path, out), "out")
    for call in (lambda: output.end_offset(0), lambda: output.append(0, [("k", 1)]), lambda: output.truncate(0, 0)):
        with pytest.raises(OutputError) as info:
            call()  # must neither block (FIFO) nor read forever (/dev/zero)
        assert_names(info.value, out / "0.jsonl")
        assert "regular file" in str(info.value)
    assert output.append(1, [("k", 1)]) == 1  # other partitions are unaffected
