"""`localstate reset --yes` deletes only what localstate created for this job: hostile changelog
paths, symlinked directories, unrelated directories named like the job and reserved job names
delete nothing else."""

import textwrap
from pathlib import Path

import pytest

from localstate.tools.cli import main
from localstate.core.config import load_job_config
from localstate.runtime.layout import open_changelog_system
from localstate.runtime.partition.instance import TaskInstance
from localstate.core.task import Envelope, StreamTask


class Put(StreamTask):
    def init(self, context):
        self.kv = context.store("kv")

    def process(self, envelope, collector, coordinator):
        self.kv.put(envelope.key, envelope.value)


def job_file(directory: Path, *, name: str = "victimjob", state_dir: str = "state", changelog: str | None = None,
             changelog_path: str | None = None, extra: str = "") -> Path:
    path = directory / f"{name}.toml"
    lines = [f'[job]\nname = "{name}"\ntask = "test_reset_safety:Put"\nstate_dir = "{state_dir}"\n']
    if changelog_path is not None:
        lines.append(f'[changelogs.file]\npath = "{changelog_path}"\n')
    lines.append('[stores.kv]\nengine = "kv"\nbackend = "lmdb"\nkey_serde = "string"\nvalue_serde = "int"\n')
    if changelog is not None:
        lines.append(f'changelog = "{changelog}"\n')
    path.write_text("\n".join(lines) + textwrap.dedent(extra))
    return path


def run_once(path: Path) -> None:
    job = load_job_config(path)
    instance = TaskInstance(job, 0, open_changelog_system(job), task_factory=Put)
    instance.open()
    instance.process(Envelope("in", 0, 0, "k", 1))
    instance.close(commit=True)


def victim(directory: Path) -> tuple[Path, callable]:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "keep.txt").write_text("mine\n")
    return directory, lambda: sorted((p.relative_to(directory), p.read_bytes() if p.is_file() else None)
                                     for p in directory.rglob("*"))


def test_reset_deletes_what_the_job_created(tmp_path, monkeypatch, capsys):
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    path = job_file(tmp_path)
    run_once(path)
    state = tmp_path / "state"
    assert (state / "victimjob").is_dir() and (state / "changelogs" / "victimjob-kv-changelog").is_dir()
    assert main(["reset", str(path), "--yes"]) == 0
    assert not (state / "victimjob").exists() and not (state / "changelogs" / "victimjob-kv-changelog").exists()


@pytest.mark.parametrize("kind", ["absolute", "relative-up"])
def test_hostile_changelog_path_deletes_nothing_outside(tmp_path, monkeypatch, capsys, kind):
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    home, snapshot = victim(tmp_path / "home" / "important")
    before = snapshot()
    changelog_path = str(home.parent) if kind == "absolute" else "../home"
    path = job_file(tmp_path, changelog="important", changelog_path=changelog_path)
    code = main(["reset", str(path), "--yes"])
    if kind == "relative-up":
        assert code == 1 and "changelogs.file.path" in capsys.readouterr().err
    else:
        assert code == 0 and "keeping" in capsys.readouterr().out
    assert snapshot() == before


def test_symlinked_changelogs_dir_is_not_followed(tmp_path, monkeypatch, capsys):
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    path = job_file(tmp_path)
    run_once(path)
    state = tmp_path / "state"
    elsewhere, snapshot = victim(tmp_path / "elsewhere" / "victimjob-kv-changelog")
    (state / "changelogs").rename(tmp_path / "moved")
    (state / "changelogs").symlink_to(elsewhere.parent, target_is_directory=True)
    before = snapshot()
    assert main(["reset", str(path), "--yes"]) == 0
    assert snapshot() == before
    assert "keeping" in capsys.readouterr().out


def test_symlinked_job_dir_is_not_followed(tmp_path, monkeypatch, capsys):
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    path = job_file(tmp_path)
    other, snapshot = victim(tmp_path / "other")
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "victimjob").symlink_to(other, target_is_directory=True)
    before = snapshot()
    assert main(["reset", str(path), "--yes"]) == 0
    assert snapshot() == before and (tmp_path / "state" / "victimjob").is_symlink()


def test_unrelated_directory_named_like_the_job_survives(tmp_path, monkeypatch, capsys):
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    home = tmp_path / "home"
    mine, snapshot = victim(home / "photos")  # the user's own directory, chosen as state_dir
    path = job_file(tmp_path, name="photos", state_dir=str(home))
    before = snapshot()
    assert main(["reset", str(path), "--yes"]) == 0
    assert snapshot() == before
    out = capsys.readouterr().out
    assert "keeping" in out and "marker" in out


def test_unrelated_changelog_directory_survives(tmp_path, monkeypatch, capsys):
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    stream_dir, snapshot = victim(tmp_path / "state" / "changelogs" / "important")
    path = job_file(tmp_path, changelog="important")
    before = snapshot()
    assert main(["reset", str(path), "--yes"]) == 0
    assert snapshot() == before


@pytest.mark.parametrize("name", ["changelogs", "checkpoints", "stores"])
def test_reserved_job_names_are_refused(tmp_path, monkeypatch, capsys, name):
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    other = job_file(tmp_path, name="other")
    run_once(other)
    before = sorted(p for p in (tmp_path / "state").rglob("*"))
    path = job_file(tmp_path, name=name)
    assert main(["reset", str(path), "--yes"]) == 1
    assert "reserved" in capsys.readouterr().err
    assert sorted(p for p in (tmp_path / "state").rglob("*")) == before


def test_job_named_like_its_changelog_dir_is_refused(tmp_path, monkeypatch, capsys):
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    path = job_file(tmp_path, name="logs", changelog_path="logs")
    assert main(["validate", str(path)]) == 1
    assert "job.name" in capsys.readouterr().err


def test_changelog_that_is_also_an_output_is_kept(tmp_path, monkeypatch, capsys):
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    state = tmp_path / "state"
    path = job_file(tmp_path, changelog="results", extra=f"""
        [outputs.results]
        system = "file"
        path = "{state / 'changelogs'}"
    """)
    # The output stream directory is created by localstate too (it carries a stream marker).
    from localstate.core.stream import open_output

    output = open_output(load_job_config(path), "results")
    output.append(0, [("k", 1)])
    output.close()
    results = state / "changelogs" / "results"
    before = sorted(results.rglob("*"))
    assert main(["reset", str(path), "--yes"]) == 0
    assert "also one of the job's inputs or outputs" in capsys.readouterr().out
    assert sorted(results.rglob("*")) == before


def test_run_writes_nothing_into_an_unrelated_directory_named_like_the_job(tmp_path, monkeypatch):
    from localstate.errors import UnsafePathError

    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    home = tmp_path / "home"
    mine, snapshot = victim(home / "photos")
    path = job_file(tmp_path, name="photos", state_dir=str(home))
    before = snapshot()
    with pytest.raises(UnsafePathError) as info:
        run_once(path)
    assert str(mine) in str(info.value)
    assert snapshot() == before


def test_run_writes_nothing_into_a_users_directory_named_like_the_changelog(tmp_path, monkeypatch):
    from localstate.errors import UnsafePathError

    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    important, snapshot = victim(tmp_path / "home" / "important")
    path = job_file(tmp_path, changelog="important", changelog_path=str(important.parent))
    before = snapshot()
    with pytest.raises(UnsafePathError):
        run_once(path)
    assert snapshot() == before


def test_state_from_a_version_without_markers_is_adopted(tmp_path, monkeypatch, capsys):
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    path = job_file(tmp_path)
    run_once(path)
    state = tmp_path / "state"
    (state / "victimjob" / ".localstate-owned").unlink()
    run_once(path)  # only checkpoints/ and stores/ inside: localstate's layout, marked again
    assert main(["reset", str(path), "--yes"]) == 0
    assert not (state / "victimjob").exists()
