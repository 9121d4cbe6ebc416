"""Subcommands of the ``localstate`` CLI that belong to the core: ``plugins``, ``validate``, ``reset``,
``seek``, ``compact`` and ``inspect``."""

from __future__ import annotations

import argparse
import os
import shutil
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from localstate.tools.cli import command, load_job
from localstate.tools.dryrun import dry_run
from localstate.tools.cli import positive_int
from localstate.core.config import job_policy, load_job_config
from localstate.core.policy import PluginPolicy
from localstate.core.registry import Registry
from localstate.core.changelog import (Compactable, DeletableStreams, DurableCheckpoints, EpochCheckpoints,
                                       LocalStreams, StreamLocations)
from localstate.core.checkpoint import Checkpoint
from localstate.core.fsutil import is_owned
from localstate.core.names import safe_join
from localstate.core.options import did_you_mean
from localstate.core.stream import IdentifiedInput, RetainedStart, open_input, open_output
from localstate.errors import ConfigError, FencedError, LocalStateError, StateNotFoundError, UnsafePathError
from localstate.runtime.layout import EPOCH_OBJECT, checkpoint_store, open_changelog_system, read_epoch
from localstate.tools.statedata import add_location_arguments, inspect_savepoint, reset_old_epochs
from localstate.tools.validation import IMPORT_TIMEOUT, require_input_paths, require_valid

if TYPE_CHECKING:
    from localstate.core.changelog import ChangelogSystem
    from localstate.core.config import JobConfig

__all__: list[str] = []


@command("plugins", "list every discovered plugin: group, name, distribution, version, status and why")
def plugins(args: argparse.Namespace) -> int:
    # The same precedence as a job run: operator (--plugins, $LOCALSTATE_PLUGINS), then the job's
    # folder if a job is named, else plugins.toml in the current directory itself (never an ancestor).
    job = getattr(args, "job", None)
    if job is not None:
        policy = job_policy(job, plugins=args.plugins)
    else:
        policy = PluginPolicy.discover(args.plugins, job_dir=Path.cwd())
    rows = [("GROUP", "NAME", "DISTRIBUTION", "VERSION", "STATUS", "WHY")]
    for info, status in Registry(policy).describe():
        rows.append((info.group, info.name, info.distribution, info.version, status, info.reason))
    widths = [max(len(row[i]) for row in rows) for i in range(5)]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths)) + "  " + row[5])
    for group, alias, target in policy.aliases:
        print(f"alias: {group}.{alias} -> {target}")
    for group, alias, target in policy.overridden_builtins():
        print(f"WARNING: built-in {group[:-1]} {alias!r} is replaced by {target!r} "
              f"(override_builtins = true in {policy.source})")
    print(f"\npolicy: {policy.describe_source()}")
    return 0


plugins.arguments = lambda parser: parser.add_argument(  # type: ignore[attr-defined]
    "job", nargs="?", help="job config (TOML): show the policy that governs this job")


@command("validate", "check a job config and report every problem with its path")
def validate(args: argparse.Namespace) -> int:
    # Every stage runs even when an earlier one failed: one run shows every problem.
    job = require_valid(args.job, plugins=args.plugins, import_timeout=args.import_timeout).job
    print(f"{args.job}: ok — job {job.name!r}, {job.partitions} partition(s), "
          f"{len(job.stores)} store(s), {len(job.inputs)} input(s), {len(job.outputs)} output(s)")
    if args.dry_run:
        print(f"dry run: the task on the first {args.dry_run} record(s) of each input partition, on scratch "
              f"state (the job's state is not touched)", flush=True)
        for partition in dry_run(job, args.dry_run):
            print(f"  {partition.describe()}")
        print(f"{args.job}: dry run ok")
    return 0


def _validate_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("job", help="job config (TOML)")
    parser.add_argument("--import-timeout", type=_seconds, default=IMPORT_TIMEOUT, metavar="SECONDS",
                        help=f"give up on a task module still importing after SECONDS (default {IMPORT_TIMEOUT:g})")
    parser.add_argument("--dry-run", type=positive_int, default=0, metavar="N",
                        help="then run the task in this process on the first N records of each input partition, "
                             "on scratch state (nothing of the job's state is touched), and report what it did")


def _seconds(text: str) -> float:
    """argparse type of a positive, finite number of seconds."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text!r}")
    return value


validate.arguments = _validate_arguments  # type: ignore[attr-defined]


@command("reset", "delete a job's checkpoints, local stores and changelogs, to start over from scratch")
def reset(args: argparse.Namespace) -> int:
    """Delete only what localstate created for this job: directories carrying its ownership marker
    (never through a symlink), and changelog streams that are not one of the job's inputs/outputs.
    Anything else is listed as kept, with the reason."""
    from localstate.runtime.statedata.epochs import epoch_places  # CLI start-up: --help does not load state epochs

    if args.old_epochs:
        return reset_old_epochs(args)
    job = load_job_config(args.job, plugins=args.plugins)
    # Epochs after the first (docs/state-as-data.md): their checkpoints and streams outside the job's directory.
    later = epoch_places(job, range(1, read_epoch(job).reserved + 1))
    later.directories.clear()  # inside the job's directory, deleted with it
    streams = sorted({store.changelog for store in job.stores.values() if store.changelog})
    durable = issubclass(job.registry.changelog_system(job.changelog_system), DurableCheckpoints)
    system = open_changelog_system(job) if streams or durable else None
    try:
        targets, kept = _reset_local_targets(job, system, streams)
        remote_streams = _reset_remote_streams(job, system, streams, kept)
        # Checkpoints kept in shared storage by the changelog system (the objectstore system).
        checkpoints = system.checkpoint_objects(job.name) if isinstance(system, DurableCheckpoints) else None
        committed = [p for p in range(job.partitions) if checkpoints is not None and checkpoints.latest(p)]
        for path, why in kept:
            print(f"keeping {path}: {why}")
        if not targets and not remote_streams and not committed and not later.any():
            print("nothing to delete")
            return 0
        for line in later.describe():
            print(f"{'deleting' if args.yes else 'would delete'} {line}")
        if committed:
            print(f"{'deleting' if args.yes else 'would delete'} the checkpoints in {checkpoints.describe()}")
        for target in targets:
            print(f"{'deleting' if args.yes else 'would delete'} {target}")
        for stream in remote_streams:
            print(f"{'deleting' if args.yes else 'would delete'} changelog {stream!r} on {job.changelog_system}")
        if not args.yes:
            print("re-run with --yes to delete; state is then rebuilt from the inputs")
            return 0
        # Checkpoints first: interrupted after them, the next start is refused (a changelog holding
        # records without a checkpoint: a lost checkpoint, see runtime.check_no_history) until reset
        # runs again; the other way round it would find checkpoints naming deleted objects.
        for partition in committed:
            checkpoints.delete_partition(partition)  # type: ignore[union-attr]
        later.delete()
        if isinstance(system, EpochCheckpoints):
            system.delete_job_object(job.name, EPOCH_OBJECT)
        for target in targets:
            shutil.rmtree(target)  # rmtree removes symlinks inside, never what they point to
        for stream in remote_streams:
            system.delete_stream(stream)  # type: ignore[union-attr]
        return 0
    finally:
        if system is not None:
            system.close()


def _reset_local_targets(job: "JobConfig", system: "ChangelogSystem | None",
                         streams: list[str]) -> tuple[list[Path], list[tuple[str, str]]]:
    """Directories ``reset`` may delete (the job dir, changelog streams kept in local directories),
    and those it keeps with why: a symlink, no ownership marker, or a place the job reads or writes."""
    targets: list[Path] = []
    kept: list[tuple[str, str]] = []

    def consider(locate, kind: str, owner: dict[str, str]) -> Path | None:  # noqa: ANN001
        try:
            path = locate()
        except UnsafePathError as exc:
            kept.append((exc.context.get("path", "?"), "it is a symlink or leaves its directory"))
            return None
        if not os.path.lexists(path):
            return None
        if not is_owned(path, kind, **owner):
            kept.append((str(path), f"localstate did not create it ({kind} marker missing); delete it by "
                                    "hand if it is really this job's"))
            return None
        return path

    job_dir = consider(lambda: safe_join(job.state_dir, job.name), "job", {"job": job.name})
    if job_dir is not None:
        targets.append(job_dir)
    if isinstance(system, LocalStreams):
        places = _stream_places(job)
        for stream in streams:
            path = consider(lambda: system.stream_dir(stream), "changelog-stream", {"stream": stream})
            if path is None:
                continue
            if any(_nested(str(path), place) for kind, place in places if kind == "path"):
                kept.append((str(path), "it is also one of the job's inputs or outputs"))
            elif job_dir is None or job_dir not in path.parents:
                targets.append(path)
    return targets, kept


def _reset_remote_streams(job: "JobConfig", system: "ChangelogSystem | None", streams: list[str],
                          kept: list[tuple[str, str]]) -> list[str]:
    """The remote changelog streams ``reset`` may delete: never one that is also an input or output
    of the job. A system that can neither delete its streams nor keeps them locally is reported."""
    if system is None or isinstance(system, LocalStreams):
        return []
    if not isinstance(system, DeletableStreams):
        print(f"changelog system {job.changelog_system!r} cannot delete streams; "
              f"delete these by hand: {', '.join(streams)}")
        return []
    places = set(_stream_places(job))
    allowed = []
    for stream in streams:
        place = system.stream_location(stream) if isinstance(system, StreamLocations) else None
        if place is not None and place in places:
            kept.append((f"changelog {stream!r} ({_PLACE_WORDS.get(place[0], place[0])} {place[1]!r})",
                         "it is also an input or output topic of the job; rename the store's changelog"))
        else:
            allowed.append(stream)
    return allowed


#: How a stream place kind reads in a message ("kafka" places are topics).
_PLACE_WORDS = {"kafka": "topic", "path": "path"}


def _stream_places(job: "JobConfig") -> list[tuple[str, str]]:
    """Where the job's inputs and outputs live (see ``InputStream.location``); unopenable ones are
    skipped (validate reports them)."""
    places = []
    for opener, names in ((open_input, job.inputs), (open_output, job.outputs)):
        for name in names:
            try:
                place = opener(job, name).location()
            except LocalStateError:
                continue
            if place is not None:
                places.append(place)
    return places


def _nested(a: str, b: str) -> bool:
    first, second = Path(a).resolve(), Path(b)
    return first == second or first in second.parents or second in first.parents


def _reset_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("job", help="job config (TOML)")
    parser.add_argument("--yes", action="store_true", help="really delete (default: show what would go)")
    parser.add_argument("--old-epochs", action="store_true", help="delete only the state epochs a rescale or a start "
                        "from a savepoint replaced, keeping the current one (docs/state-as-data.md)")


reset.arguments = _reset_arguments  # type: ignore[attr-defined]


@command("seek", "move a job's checkpointed position in one input, on purpose: after the input was replaced, "
                 "truncated or re-created (--to-end: only records appended from now on; --to-start: all it holds)")
def seek(args: argparse.Namespace) -> int:
    """Rewrite the checkpointed position of ``--input`` in each partition's checkpoint (``--partition``:
    one), through CheckpointStore: atomic, with the generation raised by one (a driver of a running
    job that saves a checkpoint it planned before is then fenced, FencedError, instead of writing the
    old position back). Every partition's instance lock is taken first: a partition a live job holds
    is refused and nothing is changed. Nothing but the checkpoints (in the state directory, or where
    the changelog system keeps them) is written; without ``--yes`` nothing at all."""
    # CLI start-up: the driver's views open the storage backends (rocksdict, lmdb), which --help does not load
    from localstate.runtime.driver.views import load_checkpoints

    job = load_job(args)
    name = args.input
    if name not in job.inputs:
        raise StateNotFoundError(f"job {job.name!r} has no input {name!r}" + did_you_mean(name, sorted(job.inputs)),
                                 input=name, hint=f"the job's inputs: {', '.join(sorted(job.inputs)) or '(none)'}")
    if args.partition is not None and not 0 <= args.partition < job.partitions:
        raise StateNotFoundError(f"job {job.name!r} has partitions 0..{job.partitions - 1}, not {args.partition}",
                                 partition=args.partition, hint="pick a partition below job.partitions")
    partitions = [args.partition] if args.partition is not None else list(range(job.partitions))
    require_input_paths(job)  # a mistyped path would look like an empty input: --to-end would move to 0
    source = open_input(job, name)
    found = load_checkpoints(job)  # read-only: nothing is created before --yes
    if not any(found.get(p) is not None for p in partitions):
        raise StateNotFoundError(f"job {job.name!r} has no checkpoint for partition(s) {partitions} in "
                                 f"{job.state_dir}: there is no position to move",
                                 hint="a job that never committed starts every input at its beginning; check "
                                      "the job file's state_dir")
    # The position moves onto the input as it is now: its identity (a Kafka topic's id, a file's) is recorded.
    identities: dict[int, str | None] = {}
    moves: dict[int, int] = {}
    for partition in partitions:
        checkpoint = found.get(partition)
        if checkpoint is None:
            print(f"partition {partition}: no checkpoint (never committed): nothing to move")
            continue
        end = source.end_offset(partition)
        start = min(source.start_offset(partition), end) if isinstance(source, RetainedStart) else 0
        target = end if args.to_end else start
        current = checkpoint.inputs.get(name)
        moves[partition] = target
        identities[partition] = source.identity(partition) if isinstance(source, IdentifiedInput) else None
        state = "" if current is None or start <= current <= end else " (outside what the input holds)"
        print(f"partition {partition}: input {name!r} position {'-' if current is None else current}{state} -> "
              f"{target} (the input holds offsets {start}..{end})")
    if not args.yes:
        print("re-run with --yes to move the position(s); stop the job first")
        return 0
    store = checkpoint_store(job)
    locked: list[int] = []
    try:
        for partition in moves:
            try:
                store.lock(partition)
            except FencedError as exc:
                raise FencedError(f"partition {partition} of job {job.name!r} is held by a running job (its instance "
                                  f"lock in {store.root}): nothing was moved", partition=partition,
                                  path=str(store.root),
                                  hint="stop the job (wait for `localstate run` to end), then run seek again") from exc
            locked.append(partition)
        for partition, target in moves.items():
            checkpoint = store.load(partition)  # again, under the lock: the latest committed one
            if checkpoint is None:
                continue
            input_ids = {key: value for key, value in checkpoint.input_ids.items() if key != name}
            if identities[partition] is not None:
                input_ids[name] = identities[partition]  # type: ignore[assignment]
            moved: Checkpoint = replace(checkpoint, generation=checkpoint.generation + 1,
                                        inputs={**checkpoint.inputs, name: target}, input_ids=input_ids)
            store.save(moved, expect_generation=checkpoint.generation)
            print(f"partition {partition}: input {name!r} moved to {target} (generation {moved.generation})")
    finally:
        for partition in locked:
            store.unlock(partition)
    return 0


def _seek_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("job", help="job config (TOML)")
    parser.add_argument("--input", required=True, metavar="NAME", help="the input whose position moves")
    parser.add_argument("--partition", type=_count, default=None, help="only this partition (default: all)")
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--to-end", action="store_true",
                       help="to the input's current end: records already there are never processed")
    where.add_argument("--to-start", action="store_true",
                       help="to the first record the input holds (0; Kafka: the log start): all of it is "
                            "processed again")
    parser.add_argument("--yes", action="store_true", help="really move (default: show what would move)")


seek.arguments = _seek_arguments  # type: ignore[attr-defined]


@command("compact", "compact a job's file changelogs up to the checkpointed offsets (last record per key)")
def compact(args: argparse.Namespace) -> int:
    job = load_job(args)
    system = open_changelog_system(job)
    if not isinstance(system, Compactable):
        print(f"changelog system {job.changelog_system!r} compacts on its own (e.g. Kafka's log cleaner); "
              "nothing to do")
        system.close()
        return 0
    checkpoints = checkpoint_store(job)
    # Only the committed prefix may be compacted: trimming after a crash needs the values before it.
    # The active segment of a partition no job writes to is sealed first, so its records count too.
    committed = checkpoints.load_all(job.partitions)
    try:
        for name, store in sorted(job.stores.items()):
            if store.changelog is None:
                continue
            upto = {p: c.changelogs.get(name, 0) for p, c in committed.items() if c is not None}
            stats = system.compact_stream(store.changelog, upto)
            print(f"{store.changelog}: {stats.records_before:,} -> {stats.records_after:,} records, "
                  f"{_size(stats.bytes_before)} -> {_size(stats.bytes_after)}, "
                  f"{stats.tombstones_dropped:,} tombstone(s) dropped, in {stats.seconds:.2f}s")
    finally:
        system.close()
    return 0


def _size(n: int) -> str:
    """``n`` bytes for people: B, kB or MB."""
    if n < 10_000:
        return f"{n:,} B"
    return f"{n / 1e3:,.1f} kB" if n < 10_000_000 else f"{n / 1e6:,.1f} MB"


compact.arguments = lambda parser: parser.add_argument("job", help="job config (TOML)")  # type: ignore[attr-defined]


@command("inspect", "show a job's state read-only: checkpoints and store partitions (default), a store's "
                    "contents (--store), or a changelog stream (--changelog)")
def inspect(args: argparse.Namespace) -> int:
    # CLI start-up: inspect reads through the driver's views, which open the storage backends (rocksdict, lmdb):
    # --help loads neither
    from localstate.tools.inspect import run_inspect

    if args.savepoint is not None:
        return inspect_savepoint(args)
    if args.job is None:
        raise ConfigError.at("inspect", "give the job file (or --savepoint PATH)", hint="localstate inspect job.toml")
    return run_inspect(load_job(args), args)


def _count(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {value}")
    return value


def _inspect_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("job", nargs="?", help="job config (TOML)")
    parser.add_argument("--savepoint", metavar="PATH", help="show this savepoint instead of a job's state (checked "
                        "whole; --store NAME: its records)")
    add_location_arguments(parser)
    parser.add_argument("--store", metavar="NAME", help="dump this store's contents, decoded with its serdes")
    parser.add_argument("--changelog", metavar="STREAM", help="show this changelog stream (or the store's)")
    parser.add_argument("--partition", type=_count, default=None, help="only this partition")
    parser.add_argument("--limit", type=_count, default=100, help="--store: at most N entries (0: all; default 100)")
    parser.add_argument("--prefix", default=None, help="--store: keys starting with this")
    parser.add_argument("--start", default=None, help="--store: keys >= this")
    parser.add_argument("--end", default=None, help="--store: keys < this")
    parser.add_argument("--from-changelog", action="store_true",
                        help="--store: replay the changelog up to the checkpoint instead of reading the local store")
    parser.add_argument("--records", type=_count, default=5, help="--changelog: records shown per partition")
    parser.add_argument("--json", action="store_true", help="JSON output (one object per line)")


inspect.arguments = _inspect_arguments  # type: ignore[attr-defined]
