"""The state-as-data commands (docs/state-as-data.md): ``localstate savepoint`` (take one, or
``--list`` those in a folder), ``localstate rescale``, and what ``run --from-savepoint``, ``inspect
--savepoint`` and ``reset --old-epochs`` do."""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from localstate.tools.cli import command, load_job, partition_count
from localstate.core.config import load_job_config, parse_job_config
from localstate.errors import ConfigError, StateNotFoundError
from localstate.runtime.layout import read_epoch

__all__ = ["location_of", "start_from_savepoint", "inspect_savepoint", "reset_old_epochs", "add_location_arguments"]


def add_location_arguments(parser: argparse.ArgumentParser) -> None:
    """The storage options of a savepoint location on object storage (credentials: the job's
    ``[changelogs.objectstore]`` table or the usual AWS environment variables)."""
    parser.add_argument("--endpoint", default=None, help="S3 endpoint of a savepoint location on s3:// "
                        "(default: the job's [changelogs.objectstore] endpoint, else AWS)")
    parser.add_argument("--region", default=None, help="S3 region of a savepoint location on s3://")


def location_of(url: str, args: argparse.Namespace, job: Any = None) -> Any:
    # CLI start-up: savepoints load pyarrow, which --help does not
    from localstate.runtime.statedata.location import SavepointLocation, storage_options

    return SavepointLocation(storage_options(url, job, endpoint=args.endpoint, region=args.region))


def _say(text: str) -> None:
    print(text, flush=True)


@command("savepoint", "write a savepoint of a job's committed state to PATH (a folder, or the URL of an S3 bucket or of any fsspec file system), "
                      "or --list the savepoints in a folder")
def savepoint(args: argparse.Namespace) -> int:
    # CLI start-up: savepoints load pyarrow, which --help does not
    from localstate.runtime.statedata.reader import Savepoint, find_savepoints
    from localstate.runtime.statedata.writer import take_savepoint

    if args.list is not None:
        folder = location_of(args.list, args)
        found = find_savepoints(folder)
        if not found:
            print(f"no savepoint in {folder.where()}")
        for path, whole in found:
            where = folder.where() if path == "." else f"{folder.where()}/{path}"
            if not whole:
                print(f"{where}\tcut short (no manifest): not usable, delete it")
                continue
            try:
                info = Savepoint.open(location_of(where, args), verify=args.verify).describe()
            except Exception as exc:  # noqa: BLE001 - one bad savepoint does not hide the others
                print(f"{where}\tnot usable: {exc}")
                continue
            stores = ", ".join(f"{name} ({entry['records']:,})" for name, entry in sorted(info["stores"].items()))
            created = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(info["created"]))
            print(f"{where}\tjob {info['job']}, {info['partitions']} partition(s), {created}, stores: {stores}")
        return 0
    if args.job is None or args.to is None:
        raise ConfigError.at("savepoint", "give the job and --to PATH (or --list FOLDER)",
                             hint="localstate savepoint job.toml --to savepoints/sp1")
    job = load_job(args)
    location = location_of(args.to, args, job)
    manifest = take_savepoint(job, location, progress=_say if args.verbose else None)
    records = sum(entry.records for entry in manifest.stores.values())
    size = sum(entry.bytes for entry in manifest.files.values())
    print(f"savepoint of job {job.name!r} ({job.partitions} partition(s), {len(manifest.stores)} store(s), "
          f"{records:,} record(s), {size:,} bytes) in {location.where()}")
    return 0


def _savepoint_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("job", nargs="?", help="job config (TOML)")
    parser.add_argument("--to", metavar="PATH", help="where: a new folder, or a URL (s3://, hdfs://, any fsspec file system)")
    parser.add_argument("--list", metavar="FOLDER", help="list the savepoints found under FOLDER instead")
    parser.add_argument("--verify", action="store_true", help="--list: also check every file's sha256")
    add_location_arguments(parser)


savepoint.arguments = _savepoint_arguments  # type: ignore[attr-defined]


@command("rescale", "move a stopped, drained job's state to another partition count (every key of its "
                    "committed state re-partitioned into a new state epoch, switched to atomically)")
def rescale(args: argparse.Namespace) -> int:
    # CLI start-up: savepoints load pyarrow, which --help does not
    from localstate.runtime.statedata.rescale import check_drained, check_stopped, rescale as run_rescale

    job = load_job(args)
    if not args.yes:
        check_stopped(job)
        check_drained(job)
        print(f"job {job.name!r}: would rescale its state from {job.partitions} to {args.partitions} partition(s) "
              "(stopped and drained: checked); re-run with --yes")
        return 0
    keep = location_of(args.savepoint, args, job) if args.savepoint else None
    pointer = run_rescale(job, args.partitions, savepoint_to=keep, progress=_say)
    print(f"job {job.name!r}: state rescaled to {pointer.partitions} partition(s) (epoch {pointer.epoch}; epoch "
          f"{pointer.previous} is kept: `localstate reset {args.job} --old-epochs --yes` removes it)")
    print(f"next: set partitions = {pointer.partitions} in {args.job}" +
          ("; point " + ", ".join(f"inputs.{name}" for name in sorted(pointer.moved_inputs)) +
           f" at the records laid out for {pointer.partitions} partitions" if pointer.moved_inputs else "") +
          "; then run it")
    return 0


def _rescale_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("job", help="job config (TOML), as it is now (its current partition count)")
    parser.add_argument("--partitions", type=partition_count, required=True, help="the new partition count")
    parser.add_argument("--yes", action="store_true", help="really rescale (default: check and show the plan)")
    parser.add_argument("--savepoint", metavar="PATH", help="take a savepoint to PATH on the way, rescale from it "
                        "and keep it (default: none; the committed state is read in place)")
    add_location_arguments(parser)


rescale.arguments = _rescale_arguments  # type: ignore[attr-defined]


def start_from_savepoint(args: argparse.Namespace) -> None:
    """``run --from-savepoint PATH``: make the savepoint the job's state (a new epoch) before the run."""
    # CLI start-up: savepoints load pyarrow, which --help does not
    from localstate.runtime.statedata.loader import LoadOptions, load_savepoint
    from localstate.runtime.statedata.reader import Savepoint
    from localstate.runtime.statedata.sources import load_function

    job = load_job_config(args.job, plugins=args.plugins)
    migrations = {}
    for spec in args.migrate or []:
        store, equals, function = spec.partition("=")
        if not equals or not store:
            raise ConfigError.at("--migrate", f"expected STORE=module:function, got {spec!r}")
        migrations[store] = load_function(job, function, f"--migrate {store}")
    savepoint = Savepoint.open(location_of(args.from_savepoint, args, job))
    pointer = load_savepoint(savepoint, job, LoadOptions(
        yes=args.yes, migrations=migrations, drop_stores=set(args.drop_store or []), other_job=args.other_job,
        progress=_say))
    print(f"job {job.name!r}: state from {savepoint.location.where()} ({savepoint.manifest.partitions} -> "
          f"{pointer.partitions} partition(s)), epoch {pointer.epoch}", flush=True)


def add_from_savepoint_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--from-savepoint", metavar="PATH", help="start from this savepoint (a new state epoch, with "
                        "the job file's partitions, stores, backends, serdes and changelog system)")
    parser.add_argument("--yes", action="store_true", help="--from-savepoint: replace the job's state if it has "
                        "some (the current epoch is kept, no longer current)")
    parser.add_argument("--migrate", action="append", metavar="STORE=module:function",
                        help="--from-savepoint: transform STORE's records on the way in ((key, value) -> (key, value) "
                             "or None); repeatable")
    parser.add_argument("--drop-store", action="append", metavar="STORE",
                        help="--from-savepoint: drop this store of the savepoint that the job no longer has")
    parser.add_argument("--other-job", action="store_true",
                        help="--from-savepoint: accept a savepoint of a job with another name")
    add_location_arguments(parser)


def inspect_savepoint(args: argparse.Namespace) -> int:
    """``inspect --savepoint PATH``: what a savepoint holds (``--store``: its records, decoded)."""
    # CLI start-up: savepoints load pyarrow, which --help does not
    from localstate.runtime.driver.views import decoder, store_serdes, to_jsonable
    # CLI start-up: savepoints load pyarrow, which --help does not
    from localstate.runtime.statedata.reader import Savepoint

    savepoint = Savepoint.open(location_of(args.savepoint, args))
    info = savepoint.describe()
    if not args.store:
        if args.json:
            print(json.dumps(info, sort_keys=True, default=str))
            return 0
        created = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(info["created"]))
        print(f"savepoint {info['location']}: job {info['job']!r}, {info['partitions']} partition(s), epoch "
              f"{info['epoch']}, taken {created}, {info['files']} file(s), {info['bytes']:,} bytes (whole: checked)")
        for name, entry in sorted(info["stores"].items()):
            layout = f", layout {entry['state_format']}" if entry["state_format"] else ""
            print(f"  store {name}: {entry['engine']}, {entry['key_serde']}/{entry['value_serde']}{layout}, "
                  f"{entry['records']:,} record(s)")
        for partition, checkpoint in sorted(info["checkpoints"].items()):
            print(f"  partition {partition}: " + ("never committed" if checkpoint is None else
                                                  f"inputs {checkpoint['inputs']}, watermark {checkpoint['watermark']}"))
        return 0
    if args.store not in savepoint.manifest.stores:
        raise StateNotFoundError(f"the savepoint has no store {args.store!r}", store=args.store,
                                 hint=f"its stores: {', '.join(sorted(savepoint.manifest.stores))}")
    job = parse_job_config({"job": {"name": savepoint.manifest.job, "task": "unused:Unused"}})
    key_serde, value_serde = store_serdes(job, savepoint.store_config(args.store))
    decode_key, decode_value = decoder(key_serde), decoder(value_serde)
    shown = 0
    for partition in range(savepoint.manifest.partitions):
        if args.partition is not None and partition != args.partition:
            continue
        for key, value in savepoint.entries(args.store, partition):
            if args.limit and shown >= args.limit:
                return 0
            row = {"partition": partition, "key": to_jsonable(decode_key(key)), "value": to_jsonable(decode_value(value))}
            print(json.dumps(row, sort_keys=True) if args.json else
                  f"{partition}\t{json.dumps(row['key'])}\t{json.dumps(row['value'], sort_keys=True)}")
            shown += 1
    return 0


def reset_old_epochs(args: argparse.Namespace) -> int:
    """``reset --old-epochs``: delete every epoch of the job's state but the current one: their
    checkpoints, local stores (on this host) and changelog streams."""
    from localstate.runtime.statedata.epochs import old_epoch_places  # CLI start-up: --help does not load state epochs

    job = load_job(args)
    current = read_epoch(job)
    places = old_epoch_places(job)
    if not places.any():
        print(f"job {job.name!r}: no epoch but the current one ({current.epoch})")
        return 0
    for line in places.describe():
        print(f"{'deleting' if args.yes else 'would delete'} {line}")
    if not args.yes:
        print("re-run with --yes to delete")
        return 0
    places.delete()
    return 0
