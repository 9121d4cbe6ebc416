"""Issue 15 (bad configuration): every option validated at its config path, never a traceback
and never silently accepted; CLI count flags validated; the crash hook unreachable in production."""

import logging
import math
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from localstate.tools.cli import main
from localstate.core.config import apply_log_level, load_job_config, parse_job_config
from localstate.core.options import live_options
from localstate.runtime.spark.config import SPARK_OPTIONS, SparkConfig
from localstate.tools.validation import check_job
from localstate.core.options import (MAX_DURATION, MAX_SIZE, Option, parse_duration, parse_path, parse_size,
                                     validate_options)
from localstate.errors import ConfigError

BASE_JOB = {"name": "j", "partitions": 2, "task": "m:T"}


def problems_of(data):
    with pytest.raises(ConfigError) as info:
        parse_job_config(data)
    return {p.path: p.message for p in info.value.problems}


def with_job(**keys):
    return {"job": {**BASE_JOB, **keys}}


# -- sizes and durations ---------------------------------------------------------------------------

BAD_SIZES = ["1e999", "1e400GB", -(1 << 2000), "-1e999", "1e-999e5", "1e308GB", "-1MB", "-1", -1, "nan", "inf", "-inf", "nanMB", "infGB", 1 << 80,
             str(MAX_SIZE * 2), "17TB", "", "MB", "1.2.3MB", "12 parsecs", True, 1.5, None, [1]]


@pytest.mark.parametrize("value", BAD_SIZES)
def test_bad_sizes_raise_value_error_only(value):
    with pytest.raises(ValueError):
        parse_size(value)


@pytest.mark.parametrize("value, expected", [(0, 0), ("0", 0), ("64MB", 64 << 20), ("1.5KB", 1536),
                                             ("512 KiB", 512 << 10), ("1TB", 1 << 40), (MAX_SIZE, MAX_SIZE)])
def test_good_sizes(value, expected):
    assert parse_size(value) == expected


BAD_DURATIONS = ["-5s", "-1", -1, -0.5, float("nan"), float("inf"), float("-inf"), "nan", "infs", "nans", "1e999s",
                 "1e400h", 10 ** 400, -(10 ** 400), "200000000d", MAX_DURATION + 1, "5 fortnights", "", "s", True]


@pytest.mark.parametrize("value", BAD_DURATIONS)
def test_bad_durations_raise_value_error_only(value):
    with pytest.raises(ValueError):
        parse_duration(value)


@pytest.mark.parametrize("value, expected", [(0, 0.0), ("250ms", 0.25), ("10s", 10.0), ("5m", 300.0),
                                             ("1h", 3600.0), (2.5, 2.5), ("1d", 86400.0),
                                             (10 ** 9, 1e9)])
def test_good_durations(value, expected):
    assert parse_duration(value) == expected


@pytest.mark.parametrize("key", ["commit_interval", "window_interval"])
@pytest.mark.parametrize("value", ["-5s", float("nan"), float("inf"), "1e999s", "-1ms", 10 ** 30])
def test_job_durations_reported_at_their_key(key, value):
    assert key in " ".join(problems_of(with_job(**{key: value})))


@pytest.mark.parametrize("value", ["1e999", "1e400GB", "-1MB", "nan", -5, 1 << 70])
def test_changelog_size_option_reported_at_its_path(value):
    problems = problems_of({**with_job(), "changelogs": {"file": {"segment_bytes": value}}})
    assert "changelogs.file.segment_bytes" in problems


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_floats_refused_by_any_option(value):
    with pytest.raises(ValueError, match="finite"):
        Option(float, minimum=0.0).check(value)


# -- [changelogs] -----------------------------------------------------------------------------------

@pytest.mark.parametrize("value", [5, "fast", True, [1, 2]])
def test_changelog_system_table_must_be_a_table(value):
    problems = problems_of({**with_job(), "changelogs": {"file": value}})
    assert "changelogs.file" in problems and "table" in problems["changelogs.file"]


# -- [spark] ----------------------------------------------------------------------------------------

def spark_problems(table):
    """What the Spark runtime (validate, run, the DataFrame step) reports of a ``[spark]`` table."""
    problems = []
    SparkConfig.parse(table, collect=problems)
    return {p.path: p.message for p in problems}


BAD_SPARK = [
    ("master", 5), ("master", ""), ("master", "local\n[*]"), ("master", True),
    ("batch_size", 0), ("batch_size", -1), ("batch_size", "x"), ("batch_size", 1.5), ("batch_size", True),
    ("worker_affinity", "yes"), ("worker_affinity", 1),
    ("pythonpath", ["lib"]), ("keep_open", True),  # earlier versions' keys: say what to write instead
    ("conf", 5), ("conf", "spark.x=1"), ("conf", {"spark.x": [1, 2]}), ("conf", {"spark.x": {"y": [1]}}),
    ("conf", {"spark.x": float("nan")}),
]


@pytest.mark.parametrize("key, value", BAD_SPARK)
def test_bad_spark_values_reported_at_their_key(key, value):
    problems = spark_problems({key: value})
    assert f"spark.{key}" in problems, problems
    with pytest.raises(ConfigError) as info:
        SparkConfig.parse({key: value})
    assert f"spark.{key}" in {p.path for p in info.value.problems}


@pytest.mark.parametrize("value", [5, "lib", [5], ["ok", "bad\0path"], [""]])
def test_bad_job_pythonpath_is_reported_at_its_key(value):
    assert "job.pythonpath" in problems_of(with_job(pythonpath=value))


def test_removed_spark_keys_say_what_to_write_instead():
    problems = spark_problems({"pythonpath": ["lib"], "keep_open": False})
    assert "[job]" in problems["spark.pythonpath"]
    assert "worker_affinity = false" in problems["spark.keep_open"]


@pytest.mark.parametrize("key, suggestion", [("batchsize", "batch_size"), ("mastr", "master"),
                                             ("worker_afinity", "worker_affinity"), ("trigers", "trigger")])
def test_unknown_spark_keys_get_did_you_mean(key, suggestion):
    problems = spark_problems({key: 1})
    assert suggestion in problems[f"spark.{key}"]


def test_spark_section_must_be_a_table():
    assert "spark" in problems_of({**with_job(), "spark": 5})


def test_a_valid_spark_table_parses_once_into_a_spark_config():
    job = parse_job_config({**with_job(pythonpath=["lib"]), "spark": {
        "master": "local[2]", "batch_size": 10, "worker_affinity": False,
        "conf": {"spark": {"executor": {"memory": "2g"}}, "spark.task.maxFailures": 4}}})
    assert job.pythonpath == ("lib",)
    spark = SparkConfig.of(job)
    assert spark == SparkConfig(master="local[2]", batch_size=10, trigger=0.0, affinity_setting=False,
                                conf={"spark.executor.memory": "2g", "spark.task.maxFailures": 4})
    assert SparkConfig.of(parse_job_config(with_job())) == SparkConfig()
    assert set(live_options(SPARK_OPTIONS)) == {"master", "batch_size", "worker_affinity", "conf", "trigger", "mode",
                                                "epoch"}
    assert SparkConfig.parse({"mode": "continuous", "epoch": "2m"}).continuous
    assert SparkConfig.parse({"mode": "continuous", "epoch": "2m"}).epoch == 120.0
    assert SparkConfig.parse({"trigger": "500ms"}).trigger == 0.5
    # command-line flags win over the table
    assert SparkConfig.of(job, master="local[4]", batch_size=3).master == "local[4]"
    assert SparkConfig.of(job, master="local[4]", batch_size=3).batch_size == 3


@pytest.mark.parametrize("master, setting, affinity", [
    ("local[2]", True, True), ("local[2,4]", True, True), ("local", True, True), ("local[*]", False, False),
    ("spark://127.0.0.1:7077", True, False), ("yarn", True, False), ("k8s://https://h:443", True, False)])
def test_worker_affinity_is_resolved_once_with_the_local_master_rule(master, setting, affinity):
    spark = SparkConfig.parse({"worker_affinity": setting}, master=master)
    assert spark.worker_affinity is affinity
    assert spark.affinity_setting is setting


# -- [job] keys ------------------------------------------------------------------------------------

@pytest.mark.parametrize("value", [5, True, ["a.toml"], {"x": 1}, "bad\0.toml"])
def test_job_plugins_must_be_a_path_string(value):
    assert "job.plugins" in problems_of(with_job(plugins=value))


@pytest.mark.parametrize("value", ["verbose", "LOUD", 10, True, "", "warn"])
def test_log_level_must_be_a_logging_level(value):
    assert "job.log_level" in problems_of(with_job(log_level=value))


def test_log_level_is_normalised_and_applied():
    job = parse_job_config(with_job(log_level="debug"))
    assert job.log_level == "DEBUG"
    logger = logging.getLogger("localstate")
    before = logger.level
    try:
        apply_log_level(job)
        assert logger.getEffectiveLevel() == logging.DEBUG
    finally:
        logger.setLevel(before)
    assert parse_job_config(with_job()).log_level is None


@pytest.mark.parametrize("value", ["st\0ate", "state\n", "a\x1bb", "x" * 300, "/" + "d/" * 2100])
def test_unusable_state_dir_reported_at_the_key(value):
    assert "job.state_dir" in problems_of(with_job(state_dir=value))


@pytest.mark.parametrize("value", ["", " ", "a\0b", "tab\there", 5])
def test_parse_path_refuses_unusable_paths(value):
    with pytest.raises(ValueError):
        parse_path(value)


@pytest.mark.parametrize("section", ["inputs", "outputs"])
def test_stream_path_with_nul_refused_at_its_key(tmp_path, section):
    from localstate.core.stream import open_input, open_output

    job = parse_job_config({**with_job(), section: {"s": {"system": "jsonl", "path": "in\0put"}}},
                           base_dir=tmp_path)
    with pytest.raises(ConfigError) as info:
        (open_input if section == "inputs" else open_output)(job, "s")
    assert [p.path for p in info.value.problems] == [f"{section}.s.path"]


# -- the job file itself ----------------------------------------------------------------------------

def test_deeply_nested_toml_is_a_config_error_naming_the_file(tmp_path):
    path = tmp_path / "job.toml"
    path.write_text("x = " + "[" * 100_000 + "]" * 100_000 + "\n")
    with pytest.raises(ConfigError) as info:
        load_job_config(path)
    assert str(path) in str(info.value)


def test_deeply_nested_inline_tables_is_a_config_error(tmp_path):
    path = tmp_path / "job.toml"
    path.write_text("x = " + "{a = " * 50_000 + "1" + "}" * 50_000 + "\n")
    with pytest.raises(ConfigError, match="job.toml"):
        load_job_config(path)


@pytest.mark.parametrize("content", [b"\xff\xfe not utf-8", b"[job\n", b"[job]\nname = \"a\"\nname = \"b\"\n",
                                     b"a = 1\0"])
def test_unparsable_job_file_is_a_config_error(tmp_path, content):
    path = tmp_path / "job.toml"
    path.write_bytes(content)
    with pytest.raises(ConfigError, match="job.toml"):
        load_job_config(path)


def test_job_file_that_is_a_directory_or_fifo_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="not a regular file"):
        load_job_config(tmp_path)
    fifo = tmp_path / "job.toml"
    os.mkfifo(fifo)
    with pytest.raises(ConfigError, match="not a regular file"):
        load_job_config(fifo)  # must not block on the FIFO


def test_job_file_path_with_nul_is_a_config_error():
    with pytest.raises(ConfigError):
        load_job_config("jo\0b.toml")


def test_every_problem_of_issue_15_reported_at_once(tmp_path):
    path = tmp_path / "job.toml"
    path.write_text(textwrap.dedent("""
        [job]
        name = "j"
        task = "m:T"
        plugins = 5
        log_level = "chatty"
        commit_interval = "-5s"
        window_interval = "nan s"
        pythonpath = 5
        [changelogs]
        file = 5
        [spark]
        batch_size = "x"
        batchsize = 3
    """))
    paths = {p.path for p in check_job(path).problems}
    assert {"job.plugins", "job.log_level", "job.commit_interval", "job.window_interval", "changelogs.file",
            "job.pythonpath", "spark.batch_size", "spark.batchsize"} <= paths


# -- CLI flags ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("flags", [["--batches", "-1"], ["--batches", "0"], ["--batch-size", "0"],
                                   ["--batch-size", "-3"], ["--batch-size", "x"], ["--batches", "1.5"],
                                   ["--batches", ""]])
def test_run_count_flags_are_usage_errors(tmp_path, capsys, flags):
    with pytest.raises(SystemExit) as info:
        main(["run", str(tmp_path / "job.toml"), *flags])
    assert info.value.code == 2
    assert flags[0] in capsys.readouterr().err


@pytest.mark.parametrize("flags", [["--partitions", "0"], ["--partitions", "100001"], ["--events", "-5"],
                                   ["--batch-size", "0"]])
def test_demo_count_flags_are_usage_errors(capsys, flags):
    with pytest.raises(SystemExit) as info:
        main(["demo", *flags])
    assert info.value.code == 2
    assert flags[0] in capsys.readouterr().err


def test_run_with_bad_config_exits_1_without_traceback(tmp_path):
    path = tmp_path / "job.toml"
    path.write_text('[job]\nname = "j"\ntask = "m:T"\n[spark]\nbatch_size = -1\n')
    proc = subprocess.run([sys.executable, "-m", "localstate", "run", str(path)], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 1, proc.stderr
    assert "spark.batch_size" in proc.stderr and "Traceback" not in proc.stderr


# -- the crash hook ------------------------------------------------------------------------------------

HOOK = "from localstate.runtime.partition.faults import crash_point; crash_point('process'); print('alive', flush=True)"


def run_hook(**env):
    environ = {k: v for k, v in os.environ.items() if k not in ("LOCALSTATE_TESTING", "LOCALSTATE_CRASH_AT")}
    return subprocess.run([sys.executable, "-c", HOOK], env={**environ, **env}, capture_output=True, text=True,
                          timeout=60)


@pytest.mark.parametrize("switch", [None, "0", "", "true", "yes"])
def test_crash_hook_ignored_without_the_test_switch(switch):
    env = {"LOCALSTATE_CRASH_AT": "process:1"}
    if switch is not None:
        env["LOCALSTATE_TESTING"] = switch
    proc = run_hook(**env)
    assert proc.returncode == 0 and "alive" in proc.stdout, proc.stderr
    assert "ignored" in proc.stderr


def test_crash_hook_fires_with_the_test_switch():
    proc = run_hook(LOCALSTATE_CRASH_AT="process:1", LOCALSTATE_TESTING="1")
    assert proc.returncode == -signal.SIGKILL
    assert "alive" not in proc.stdout


@pytest.mark.parametrize("spec", ["process:x", "process:", ":3"])
def test_malformed_crash_spec_never_crashes(spec):
    proc = run_hook(LOCALSTATE_CRASH_AT=spec, LOCALSTATE_TESTING="1")
    if spec == "process:":  # count defaults to 1
        assert proc.returncode == -signal.SIGKILL
    else:
        assert proc.returncode == 0 and "alive" in proc.stdout, proc.stderr


def test_the_suite_sets_the_test_switch_for_child_processes():
    assert os.environ.get("LOCALSTATE_TESTING") == "1"
    assert math.isfinite(MAX_DURATION)


@pytest.mark.parametrize("option", ["cache_size", "bloom_bits", "write_batch_size", "restore_batch_size"])
@pytest.mark.parametrize("value", [1 << 64, -(1 << 70), float("nan")])
def test_kv_integer_options_reject_out_of_range_values(option, value):
    data = {**with_job(), "stores": {"s": {"engine": "kv", "backend": "rocksdb", option: value}}}
    assert f"stores.s.{option}" in problems_of(data)


@pytest.mark.parametrize("content", ["x = " + "[" * 100_000 + "]" * 100_000, "[policy\n", "\0"])
def test_unparsable_plugin_policy_is_a_config_error_naming_the_file(tmp_path, content):
    from localstate.core.policy import PluginPolicy

    path = tmp_path / "plugins.toml"
    path.write_text(content)
    with pytest.raises(ConfigError, match="plugins.toml"):
        PluginPolicy.discover(path)


def test_plugin_policy_that_is_a_fifo_is_refused(tmp_path):
    from localstate.core.policy import PluginPolicy

    path = tmp_path / "plugins.toml"
    os.mkfifo(path)
    with pytest.raises(ConfigError, match="plugins.toml"):
        PluginPolicy.discover(path)  # must not block on the FIFO
    with pytest.raises(ConfigError, match="not a regular file"):
        PluginPolicy.load(path)


@pytest.mark.parametrize("value", [10 ** 400, -(10 ** 400), 1 << 63])
def test_huge_integers_for_float_options_are_value_errors(value):
    with pytest.raises(ValueError, match="64 bits"):
        Option(float).check(value)
    with pytest.raises(ConfigError) as info:
        validate_options({"t": Option((int, float, str), parse=parse_duration)}, {"t": value}, "x")
    assert [p.path for p in info.value.problems] == ["x.t"]
