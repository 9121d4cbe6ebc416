"""Job config validation: every problem reported at once, with its path; names never escape."""

import subprocess
import sys
import textwrap

import pytest

from localstate.core.config import load_job_config, parse_job_config
from localstate.core.names import safe_join
from localstate.errors import ConfigError, InvalidNameError

BASE = {"job": {"name": "j", "partitions": 2, "task": "m:T"},
        "stores": {"counts": {"engine": "kv", "backend": "memory", "key_serde": "string", "value_serde": "int"}}}


def config(**overrides):
    data = {"job": dict(BASE["job"]), "stores": {k: dict(v) for k, v in BASE["stores"].items()}}
    for path, value in overrides.items():
        section, _, rest = path.partition("__")
        table = data.setdefault(section, {})
        *parents, leaf = rest.split("__")
        for parent in parents:
            table = table.setdefault(parent, {})
        table[leaf] = value
    return data


def problems_of(data):
    with pytest.raises(ConfigError) as info:
        parse_job_config(data)
    return {p.path: p.message for p in info.value.problems}


def test_valid_config_parses_with_defaults(tmp_path):
    job = parse_job_config(config(), base_dir=tmp_path)
    store = job.stores["counts"]
    assert (job.name, job.partitions, store.engine, store.changelog) == ("j", 2, "kv", "j-counts-changelog")
    assert store.options["backend"] == "memory"
    assert job.state_dir == (tmp_path / "state").resolve()


@pytest.mark.parametrize("bad", ["../x", "", "has space", ".", "..", "a/b", "x" * 201])
def test_bad_store_names_are_rejected(bad):
    data = config()
    data["stores"][bad] = {"engine": "kv"}
    assert any(bad in path or path == f"stores.{bad}" for path in problems_of(data))


@pytest.mark.parametrize("bad", ["../x", "", "has space"])
def test_bad_job_and_stream_names_are_rejected(bad):
    assert "job.name" in problems_of(config(job__name=bad))
    assert "stores.counts.changelog" in problems_of(config(stores__counts__changelog=bad))


def test_safe_join_refuses_escape(tmp_path):
    with pytest.raises(InvalidNameError):
        safe_join(tmp_path, "..", "etc")
    assert safe_join(tmp_path, "a", "b") == (tmp_path / "a" / "b").resolve()


def test_unknown_engine_lists_available_with_did_you_mean():
    problems = problems_of(config(stores__counts__engine="kvv"))
    message = problems["stores.counts.engine"]
    assert "did you mean 'kv'" in message and "available" in message


def test_unknown_and_ill_typed_engine_options_name_their_path():
    problems = problems_of(config(stores__counts__cache_sise=10, stores__counts__write_batch_size="many"))
    assert "stores.counts.cache_sise" in problems and "did you mean 'cache_size'" in problems["stores.counts.cache_sise"]
    assert "stores.counts.write_batch_size" in problems


def test_removed_engine_options_say_what_to_write_instead():
    data = config(stores__top__engine="heap", stores__top__mode="reorder", stores__top__max_lateness=5,
                  stores__top__kv={"block_cache_size": "8MB"}, stores__counts__cache_sise=10)
    problems = problems_of(data)
    assert set(problems) == {"stores.top.mode", "stores.top.kv", "stores.counts.cache_sise"}  # all at once
    assert 'write kind = "reorder" instead' in problems["stores.top.mode"]
    assert "top level" in problems["stores.top.kv"]
    assert "unknown option" not in problems["stores.top.mode"] + problems["stores.top.kv"]


def test_pickle_needs_opt_in_and_other_stores_still_validate():
    data = config(stores__blobs__engine="kv", stores__blobs__value_serde="pickle")
    problems = problems_of(data)
    assert list(problems) == ["stores.blobs.value_serde"]
    assert "allow_pickle" in problems["stores.blobs.value_serde"]
    data["job"]["allow_pickle"] = True
    assert parse_job_config(data).stores["blobs"].value_serde == "pickle"


def test_three_mistakes_reported_together(tmp_path):
    job_file = tmp_path / "job.toml"
    job_file.write_text(textwrap.dedent("""
        [job]
        name = "../escape"
        partitions = 0
        task = "tasks:Counter"

        [stores.counts]
        engine = "kv"
        cache_size = "big"
    """))
    with pytest.raises(ConfigError) as info:
        load_job_config(job_file)
    assert {p.path for p in info.value.problems} == {"job.name", "job.partitions", "stores.counts.cache_size"}

    result = subprocess.run([sys.executable, "-m", "localstate", "validate", str(job_file)],
                            capture_output=True, text=True)
    assert result.returncode == 1
    # validate goes on past the file's shape: the task module does not exist either
    for path in ("job.name", "job.partitions", "stores.counts.cache_size", "job.task"):
        assert path in result.stderr
    assert "4 problems" in result.stderr


def test_toml_syntax_error_names_the_file(tmp_path):
    job_file = tmp_path / "broken.toml"
    job_file.write_text("[job\nname = 1")
    with pytest.raises(ConfigError) as info:
        load_job_config(job_file)
    assert "broken.toml" in str(info.value)


def test_validate_ok_exits_zero(tmp_path):
    job_file = tmp_path / "job.toml"
    job_file.write_text('[job]\nname = "ok"\ntask = "t:T"\n[stores.s]\nengine = "kv"\nbackend = "lmdb"\n')
    # the task module sits next to the job file, as in the examples
    (tmp_path / "t.py").write_text("from localstate.core.task import StreamTask\n\n"
                                   "class T(StreamTask):\n    def process(self, envelope, collector, coordinator):\n"
                                   "        pass\n")
    result = subprocess.run([sys.executable, "-m", "localstate", "validate", str(job_file)],
                            capture_output=True, text=True, cwd=tmp_path.parent)
    assert result.returncode == 0, result.stderr
    assert "ok" in result.stdout


def test_validate_checks_stream_options_and_the_task(tmp_path):
    """Problems that only show when the job opens its streams or imports its task are reported by
    `localstate validate` too, all at once, without connecting to any broker."""
    job_file = tmp_path / "job.toml"
    job_file.write_text(textwrap.dedent("""
        [job]
        name = "j"
        task = "no_such_module:Task"
        [inputs.views]
        system = "jsonl"
        path = "in"
        on_eror = "skip"
        [outputs.counts]
        system = "kafka"
        topic = "counts"
        bootstrap_servers = "localhost:1"
        linger = "soon"
    """))
    result = subprocess.run([sys.executable, "-m", "localstate", "validate", str(job_file)],
                            capture_output=True, text=True, cwd=tmp_path)
    assert result.returncode == 1
    assert "inputs.views.on_eror" in result.stderr and "on_error" in result.stderr  # did-you-mean
    assert "outputs.counts" in result.stderr
    assert "job.task" in result.stderr and "no_such_module" in result.stderr
    assert "3 problems" in result.stderr
