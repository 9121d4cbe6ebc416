"""Subcommands of the ``localstate`` CLI that belong to the core: ``plugins`` and ``validate``."""

from __future__ import annotations

import argparse
from pathlib import Path

from localstate.core.cli import command
from localstate.core.config import load_job_config
from localstate.core.policy import PluginPolicy
from localstate.core.registry import Registry

__all__: list[str] = []


@command("plugins", "list every discovered plugin: group, name, distribution, version, status and why")
def plugins(args: argparse.Namespace) -> int:
    policy = PluginPolicy.discover(args.plugins)
    rows = [("GROUP", "NAME", "DISTRIBUTION", "VERSION", "STATUS", "WHY")]
    for info, status in Registry(policy).describe():
        rows.append((info.group, info.name, info.distribution, info.version, status, info.reason))
    widths = [max(len(row[i]) for row in rows) for i in range(5)]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths)) + "  " + row[5])
    print(f"\npolicy: {policy.source or 'default (no plugins.toml found): every installed plugin may load'}")
    return 0


@command("validate", "check a job config and report every problem with its path")
def validate(args: argparse.Namespace) -> int:
    from localstate.core.streams import open_input, open_output
    from localstate.core.task import add_task_paths, load_task_class
    from localstate.errors import ConfigError

    job = load_job_config(args.job, plugins=args.plugins)
    # Beyond the file's shape: each input's and output's options and the task class. Stream
    # constructors only validate (they connect to nothing), so this is safe without a broker.
    problems = []
    for name in job.inputs:
        try:
            open_input(job, name)
        except ConfigError as exc:
            problems.extend(exc.problems)
    for name in job.outputs:
        try:
            open_output(job, name)
        except ConfigError as exc:
            problems.extend(exc.problems)
    add_task_paths(job)
    task_error = None
    try:
        load_task_class(job.task)
    except ConfigError as exc:
        problems.extend(exc.problems)
        task_error = exc
    if problems:
        error = ConfigError(problems, source=str(args.job))
        if task_error is not None:  # keep where the task's module failed, for the CLI to print
            error.traceback, error.traceback_summary = task_error.traceback, task_error.traceback_summary
            error.location = task_error.location
        raise error
    print(f"{args.job}: ok — job {job.name!r}, {job.partitions} partition(s), "
          f"{len(job.stores)} store(s), {len(job.inputs)} input(s), {len(job.outputs)} output(s)")
    return 0


validate.arguments = lambda parser: parser.add_argument("job", help="job config (TOML)")  # type: ignore[attr-defined]


@command("reset", "delete a job's checkpoints, local stores and changelogs, to start over from scratch")
def reset(args: argparse.Namespace) -> int:
    import shutil

    from localstate.core.names import safe_join
    from localstate.core.runtime import open_changelog_system

    job = load_job_config(args.job, plugins=args.plugins)
    targets = [safe_join(job.state_dir, job.name)]
    streams = [store.changelog for store in job.stores.values() if store.changelog]
    # Changelogs that live outside the state directory (e.g. Kafka topics) are deleted through the
    # system's optional delete_stream() capability.
    remote = None
    if job.changelog_system == "file":
        root = job.changelog_options.get("file", {}).get("path") or "changelogs"
        base = safe_join(job.state_dir) / root if not str(root).startswith("/") else Path(root)
        targets += [base / stream for stream in streams]
    elif streams:
        remote = open_changelog_system(job)
        if not hasattr(remote, "delete_stream"):
            print(f"changelog system {job.changelog_system!r} cannot delete streams; "
                  f"delete these by hand: {', '.join(streams)}")
            streams = []
    existing = [t for t in targets if t.exists()]
    remote_streams = streams if remote is not None else []
    if not existing and not remote_streams:
        print("nothing to delete")
        return 0
    for target in existing:
        print(f"{'deleting' if args.yes else 'would delete'} {target}")
    for stream in remote_streams:
        print(f"{'deleting' if args.yes else 'would delete'} changelog {stream!r} on {job.changelog_system}")
    if not args.yes:
        print("re-run with --yes to delete; state is then rebuilt from the inputs")
        return 0
    for target in existing:
        shutil.rmtree(target)
    for stream in remote_streams:
        remote.delete_stream(stream)  # type: ignore[union-attr]
    if remote is not None:
        remote.close()
    return 0


def _reset_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("job", help="job config (TOML)")
    parser.add_argument("--yes", action="store_true", help="really delete (default: show what would go)")


reset.arguments = _reset_arguments  # type: ignore[attr-defined]


@command("compact", "compact a job's file changelogs up to the checkpointed offsets (last record per key)")
def compact(args: argparse.Namespace) -> int:
    from localstate.changelog.file import FileChangelogSystem, compact_stream
    from localstate.core.runtime import checkpoint_store, open_changelog_system

    job = load_job_config(args.job, plugins=args.plugins)
    system = open_changelog_system(job)
    if not isinstance(system, FileChangelogSystem):
        print(f"changelog system {job.changelog_system!r} compacts on its own (e.g. Kafka's log cleaner); "
              "nothing to do")
        return 0
    checkpoints = checkpoint_store(job)
    # Only the committed prefix may be compacted: trimming after a crash needs the values before it.
    committed = {p: checkpoints.load(p) for p in range(job.partitions)}
    for name, store in sorted(job.stores.items()):
        if store.changelog is None:
            continue
        upto = {p: c.changelogs.get(name, 0) for p, c in committed.items() if c is not None}
        stats = compact_stream(system, store.changelog, upto)
        print(f"{store.changelog}: {stats.records_before} -> {stats.records_after} records, "
              f"{stats.bytes_before / 1e6:.1f} -> {stats.bytes_after / 1e6:.1f} MB in {stats.seconds:.2f}s")
    system.close()
    return 0


compact.arguments = lambda parser: parser.add_argument("job", help="job config (TOML)")  # type: ignore[attr-defined]
