"""Subcommands of the ``localstate`` CLI that belong to the core: ``plugins`` and ``validate``."""

from __future__ import annotations

import argparse
import json
import sys
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
    from localstate.core.validation import check_job
    from localstate.errors import ConfigError

    # Every stage runs even when an earlier one failed: one run shows every problem.
    check = check_job(args.job, plugins=args.plugins)
    for note in check.notes:
        print(f"{args.job}: warning: {note}", file=sys.stderr)
    if check.problems:
        raise ConfigError(check.problems, source=str(args.job))
    job = check.job
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


@command("inspect", "show a job's state read-only: checkpoints and store partitions (default), a store's "
                    "contents (--store), or a changelog stream (--changelog)")
def inspect(args: argparse.Namespace) -> int:
    from localstate.core import inspect as view

    job = load_job_config(args.job, plugins=args.plugins)
    if args.partition is not None and not 0 <= args.partition < job.partitions:
        from localstate.errors import StateNotFoundError
        raise StateNotFoundError(f"job {job.name!r} has partitions 0..{job.partitions - 1}, not {args.partition}",
                                 partition=args.partition, hint="pick a partition below job.partitions")
    partitions = [args.partition] if args.partition is not None else None
    if args.store and args.changelog:
        from localstate.errors import ConfigError
        raise ConfigError.at("", "--store and --changelog are exclusive", hint="inspect one thing at a time")
    if args.store:
        view.store_config(job, args.store)  # a bad name fails before anything else is read
        checkpoints = view.require_state(job)
        key_filter = _key_filter(job, args)
        shown = 0
        for entry in view.store_entries(job, args.store, checkpoints, partitions=partitions,
                                        from_changelog=args.from_changelog, key_filter=key_filter):
            if args.limit and shown >= args.limit:
                print(f"... (--limit {args.limit} reached; --limit 0 shows all)", file=sys.stderr)
                break
            key, value = view.to_jsonable(entry.key), view.to_jsonable(entry.value)
            if args.json:
                print(json.dumps({"partition": entry.partition, "key": key, "value": value}, sort_keys=True))
            else:
                print(f"{entry.partition}\t{json.dumps(key)}\t{json.dumps(value, sort_keys=True)}")
            shown += 1
        return 0
    if args.changelog:
        stream, store = view.resolve_stream(job, args.changelog)
        checkpoints = view.require_state(job)
        infos = view.changelog_partitions(job, stream, store, checkpoints, partitions)
        key_serde, value_serde = view.store_serdes(job, store) if store else (None, None)
        for info in infos:
            records = []
            if info.exists and args.records:
                for record in view.changelog_records(job, stream, info.partition, 0, info.end):
                    records.append(record)
                    if len(records) >= args.records:
                        break
            decode_key, decode_value = view.decoder(key_serde), view.decoder(value_serde)
            decoded = [{"offset": r.offset, "key": view.to_jsonable(decode_key(r.key)),
                        "value": None if r.value is None else view.to_jsonable(decode_value(r.value))}
                       for r in records]
            if args.json:
                print(json.dumps({"stream": stream, "partition": info.partition, "directory": str(info.directory),
                                  "exists": info.exists, "start": info.start, "end": info.end,
                                  "checkpoint": info.checkpoint_offset,
                                  "segments": [{"name": s.name, "bytes": s.bytes} for s in info.segments],
                                  "records": decoded}, sort_keys=True))
                continue
            print(f"{stream} partition {info.partition}: {info.directory}"
                  + ("" if info.exists else " (does not exist)"))
            print(f"  offsets {info.start if info.start is not None else '-'}..{info.end} "
                  f"(end {info.end}), checkpointed {info.checkpoint_offset if info.checkpoint_offset is not None else '-'}")
            for segment in info.segments:
                print(f"  segment {segment.name}  {segment.bytes:,} bytes")
            for record in decoded:
                value = "(tombstone)" if record["value"] is None else json.dumps(record["value"], sort_keys=True)
                print(f"  @{record['offset']}  {json.dumps(record['key'])}  {value}")
        return 0
    return _inspect_overview(job, view, partitions, args.json)


def _key_filter(job, args: argparse.Namespace):  # noqa: ANN001, ANN202
    """Select keys by --prefix or --start/--end, compared as the store's key type (int keys as ints)."""
    if args.prefix is None and args.start is None and args.end is None:
        return None
    from localstate.errors import ConfigError

    if args.prefix is not None and (args.start is not None or args.end is not None):
        raise ConfigError.at("", "--prefix and --start/--end are exclusive", hint="use one way to select keys")
    as_int = job.stores[args.store].key_serde == "int"
    try:
        start = int(args.start) if as_int and args.start is not None else args.start
        end = int(args.end) if as_int and args.end is not None else args.end
    except ValueError:
        raise ConfigError.at("", f"store {args.store!r} has int keys: --start/--end must be integers",
                             hint="e.g. --start 10 --end 20") from None

    def select(key) -> bool:  # noqa: ANN001
        if isinstance(key, (bytes, bytearray)):  # raw keys: compare bytes with the arguments' UTF-8
            key, low, high, prefix = bytes(key), *(None if x is None else x.encode()
                                                   for x in (args.start, args.end, args.prefix))
        else:
            key, low, high, prefix = (key if as_int else str(key)), start, end, args.prefix
        if prefix is not None:
            return not isinstance(key, int) and key.startswith(prefix)
        try:
            return (low is None or key >= low) and (high is None or key < high)
        except TypeError:  # a key of another type than the bounds
            return False

    return select


def _inspect_overview(job, view, partitions, as_json: bool) -> int:  # noqa: ANN001
    checkpoints = view.require_state(job)
    stores = [info for name in sorted(job.stores) for info in view.store_partitions(job, name, checkpoints, partitions)]
    changelogs = view.changelog_root(job)
    if as_json:
        print(json.dumps({
            "job": job.name, "partitions": job.partitions, "state_dir": str(view.job_dir(job)),
            "changelogs": str(changelogs) if changelogs else job.changelog_system,
            "checkpoints": {str(p): (None if c is None else {"generation": c.generation, "inputs": c.inputs,
                                                              "changelogs": c.changelogs, "outputs": c.outputs})
                            for p, c in checkpoints.items() if partitions is None or p in partitions},
            "stores": [{"store": i.store, "partition": i.partition, "engine": i.engine, "backend": i.backend,
                        "directory": str(i.directory), "exists": i.exists, "bytes": i.bytes,
                        "local_offset": i.local_offset, "keys": i.keys, "checkpoint_offset": i.checkpoint_offset,
                        "changelog_end": i.changelog_end, "notes": i.notes} for i in stores],
            "inputs": {n: view.stream_location(job, "inputs", n) for n in job.inputs},
            "outputs": {n: view.stream_location(job, "outputs", n) for n in job.outputs},
        }, sort_keys=True))
        return 0
    print(f"job {job.name!r}: {job.partitions} partition(s), state in {view.job_dir(job)}")
    print(f"changelogs: {changelogs if changelogs else job.changelog_system}")
    print("checkpoints:")
    for partition, checkpoint in checkpoints.items():
        if partitions is not None and partition not in partitions:
            continue
        if checkpoint is None:
            print(f"  partition {partition}: none (never committed)")
            continue
        print(f"  partition {partition}: generation {checkpoint.generation}, inputs {checkpoint.inputs}, "
              f"changelogs {checkpoint.changelogs}, outputs {checkpoint.outputs}")
    print("stores:")
    rows = [("STORE", "PART", "ENGINE", "BACKEND", "LOCAL", "CHECKPOINT", "CHANGELOG_END", "KEYS", "BYTES")]
    dash = lambda value: "-" if value is None else str(value)  # noqa: E731
    for i in stores:
        rows.append((i.store, str(i.partition), i.engine, dash(i.backend),
                     dash(i.local_offset) if i.exists else "(none)", dash(i.checkpoint_offset),
                     dash(i.changelog_end), dash(i.keys), f"{i.bytes:,}"))
    widths = [max(len(row[c]) for row in rows) for c in range(len(rows[0]))]
    for row in rows:
        print("  " + "  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip())
    for i in stores:
        for note in i.notes:
            print(f"  {i.store}[{i.partition}]: {note}")
    for section in ("inputs", "outputs"):
        names = job.inputs if section == "inputs" else job.outputs
        for name in names:
            print(f"{section[:-1]} {name}: {view.stream_location(job, section, name)}")
    return 0


def _inspect_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("job", help="job config (TOML)")
    parser.add_argument("--store", metavar="NAME", help="dump this store's contents, decoded with its serdes")
    parser.add_argument("--changelog", metavar="STREAM", help="show this changelog stream (or the store's)")
    parser.add_argument("--partition", type=int, default=None, help="only this partition")
    parser.add_argument("--limit", type=int, default=100, help="--store: at most N entries (0: all; default 100)")
    parser.add_argument("--prefix", default=None, help="--store: keys starting with this")
    parser.add_argument("--start", default=None, help="--store: keys >= this")
    parser.add_argument("--end", default=None, help="--store: keys < this")
    parser.add_argument("--from-changelog", action="store_true",
                        help="--store: replay the changelog up to the checkpoint instead of reading the local store")
    parser.add_argument("--records", type=int, default=5, help="--changelog: records shown per partition")
    parser.add_argument("--json", action="store_true", help="JSON output (one object per line)")


inspect.arguments = _inspect_arguments  # type: ignore[attr-defined]
