"""``localstate inspect``: print a job's checkpoints, store partitions, store contents and changelog
streams, read-only, through :mod:`localstate.runtime.driver.views`."""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from itertools import islice
from typing import Any, Callable

from localstate.core.config import JobConfig
from localstate.errors import ConfigError, StateNotFoundError

from localstate.runtime.driver.views import changelog_partitions, changelog_records, changelog_root, checkpoint_location, decoder, job_dir, require_state, resolve_stream, store_config, store_entries, store_partitions, store_serdes, stream_location, to_jsonable, value_splitter
from localstate.runtime.driver.views import InputPartitionInfo, input_partitions

__all__ = ["run_inspect"]

log = logging.getLogger(__name__)


# -- the command -------------------------------------------------------------------------------------

def run_inspect(job: JobConfig, args: argparse.Namespace) -> int:
    """``localstate inspect``: print what ``args`` asks for (see the command's --help)."""
    if args.partition is not None and not 0 <= args.partition < job.partitions:
        raise StateNotFoundError(f"job {job.name!r} has partitions 0..{job.partitions - 1}, not {args.partition}",
                                 partition=args.partition, hint="pick a partition below job.partitions")
    partitions = [args.partition] if args.partition is not None else None
    if args.store and args.changelog:
        raise ConfigError.at("", "--store and --changelog are exclusive", hint="inspect one thing at a time")
    if args.store:
        return _print_store(job, args, partitions)
    if args.changelog:
        return _print_changelog(job, args, partitions)
    return _inspect_overview(job, partitions, args.json)


def _print_store(job: JobConfig, args: argparse.Namespace, partitions: list[int] | None) -> int:
    store_config(job, args.store)  # a bad name fails before anything else is read
    checkpoints = require_state(job)
    key_filter = _key_filter(job, args)
    shown = 0
    for entry in store_entries(job, args.store, checkpoints, partitions=partitions,
                               from_changelog=args.from_changelog, key_filter=key_filter):
        if args.limit and shown >= args.limit:
            print(f"... (--limit {args.limit} reached; --limit 0 shows all)", file=sys.stderr)
            break
        key, value = to_jsonable(entry.key), to_jsonable(entry.value)
        if args.json:
            print(json.dumps({"partition": entry.partition, "key": key, "value": value}, sort_keys=True))
        else:
            print(f"{entry.partition}\t{json.dumps(key)}\t{json.dumps(value, sort_keys=True)}")
        shown += 1
    return 0


def _print_changelog(job: JobConfig, args: argparse.Namespace, partitions: list[int] | None) -> int:
    stream, store = resolve_stream(job, args.changelog)
    checkpoints = require_state(job)
    key_serde, value_serde = store_serdes(job, store) if store else (None, None)
    decode_key, decode_value = decoder(key_serde), decoder(value_serde)
    split = value_splitter(job, store)
    for info in changelog_partitions(job, stream, store, checkpoints, partitions):
        records = list(islice(changelog_records(job, stream, info.partition, 0, info.end), max(args.records, 0)))
        decoded = [_decoded_record(r, decode_key, decode_value, split) for r in records]
        if args.json:
            print(json.dumps({"stream": stream, "partition": info.partition, "directory": None if info.directory is None else str(info.directory),
                              "exists": info.exists, "start": info.start, "end": info.end,
                              "checkpoint": info.checkpoint_offset,
                              "segments": [{"name": s.name, "bytes": s.bytes} for s in info.segments],
                              "records": decoded}, sort_keys=True))
            continue
        dash = lambda value: "-" if value is None else str(value)  # noqa: E731
        where = info.directory if info.directory is not None else f"({job.changelog_system})"
        print(f"{stream} partition {info.partition}: {where}" + ("" if info.exists else " (does not exist)"))
        print(f"  offsets {dash(info.start)}..{info.end} (end {info.end}), checkpointed {dash(info.checkpoint_offset)}")
        for segment in info.segments:
            print(f"  segment {segment.name}  {segment.bytes:,} bytes")
        for record in decoded:
            value = "(tombstone)" if record["value"] is None else json.dumps(record["value"], sort_keys=True)
            expires = f"  (expires {record['expires']})" if "expires" in record else ""
            print(f"  @{record['offset']}  {json.dumps(record['key'])}  {value}{expires}")
    return 0


def _decoded_record(record: Any, decode_key: Callable[[bytes], Any], decode_value: Callable[[bytes], Any],
                    split: Callable[[bytes], tuple[bytes, float | None]] | None) -> dict[str, Any]:
    """One changelog record for display; a ttl store's value without its expiry, shown beside it
    (seconds since the epoch, in the store's ttl time domain)."""
    decoded = {"offset": record.offset, "key": to_jsonable(decode_key(record.key)), "value": None}
    if record.value is not None:
        data = record.value
        if split is not None:
            data, decoded["expires"] = split(data)
        decoded["value"] = to_jsonable(decode_value(data))
    return decoded


def _key_filter(job: JobConfig, args: argparse.Namespace) -> Callable[[Any], bool] | None:
    """Select keys by --prefix or --start/--end, compared as the store's key type (int keys as ints)."""
    if args.prefix is None and args.start is None and args.end is None:
        return None
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


def _print_inputs(inputs: list[InputPartitionInfo]) -> None:
    """The overview's input table: checkpointed position, end, lag and unterminated bytes per input
    partition, then each problem (a position the input does not hold) and each unterminated tail."""
    if not inputs:
        return
    print("inputs:")
    dash = lambda value: "-" if value is None else str(value)  # noqa: E731
    rows = [("INPUT", "PART", "POSITION", "END", "LAG", "UNTERMINATED_BYTES")]
    rows += [(i.input, str(i.partition), dash(i.position), dash(i.end), dash(i.lag), str(i.pending_bytes))
             for i in inputs]
    widths = [max(len(row[c]) for row in rows) for c in range(len(rows[0]))]
    for row in rows:
        print("  " + "  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip())
    for i in inputs:
        if i.problem:
            print(f"  {i.input}[{i.partition}]: {i.problem}")
        if i.pending_bytes:
            age = f", unchanged for {time.time() - i.pending_since:.0f}s" if i.pending_since is not None else ""
            print(f"  {i.input}[{i.partition}]: {i.pending_bytes:,} byte(s) of an unterminated record at offset "
                  f"{dash(i.end)}{age} (an append in progress: not read until complete)")


def _inspect_overview(job: JobConfig, partitions: list[int] | None, as_json: bool) -> int:
    checkpoints = require_state(job)
    stores = [info for name in sorted(job.stores) for info in store_partitions(job, name, checkpoints, partitions)]
    inputs = input_partitions(job, checkpoints, partitions)
    changelogs = changelog_root(job)
    if as_json:
        print(json.dumps({
            "job": job.name, "partitions": job.partitions, "state_dir": str(job_dir(job)),
            "changelogs": str(changelogs) if changelogs else job.changelog_system,
            "checkpoints": {str(p): (None if c is None else {"generation": c.generation, "inputs": c.inputs,
                                                              "changelogs": c.changelogs, "outputs": c.outputs,
                                                              "manifests": c.manifests})
                            for p, c in checkpoints.items() if partitions is None or p in partitions},
            "stores": [{"store": i.store, "partition": i.partition, "engine": i.engine, "backend": i.backend,
                        "directory": str(i.directory), "exists": i.exists, "bytes": i.bytes,
                        "local_offset": i.local_offset, "keys": i.keys, "checkpoint_offset": i.checkpoint_offset,
                        "changelog_end": i.changelog_end, "notes": i.notes} for i in stores],
            "inputs": {n: stream_location(job, "inputs", n) for n in job.inputs},
            "input_partitions": [{"input": i.input, "partition": i.partition, "position": i.position, "end": i.end,
                                  "lag": i.lag, "pending_bytes": i.pending_bytes, "pending_since": i.pending_since,
                                  "problem": i.problem} for i in inputs],
            "outputs": {n: stream_location(job, "outputs", n) for n in job.outputs},
        }, sort_keys=True))
        return 0
    print(f"job {job.name!r}: {job.partitions} partition(s), state in {job_dir(job)}")
    print(f"changelogs: {changelogs if changelogs else job.changelog_system}")
    durable = checkpoint_location(job)
    if durable is not None:
        print(f"checkpoints and changelogs in shared storage: {durable}")
    print("checkpoints:")
    for partition, checkpoint in checkpoints.items():
        if partitions is not None and partition not in partitions:
            continue
        if checkpoint is None:
            print(f"  partition {partition}: none (never committed)")
            continue
        print(f"  partition {partition}: generation {checkpoint.generation}, inputs {checkpoint.inputs}, "
              f"changelogs {checkpoint.changelogs}, outputs {checkpoint.outputs}")
        for store, manifest in sorted(checkpoint.manifests.items()):
            snapshot = manifest.get("snapshot")
            deltas = manifest.get("deltas") or []
            print(f"    {store}: " + (f"snapshot up to {snapshot.get('end')} ({snapshot.get('records')} records)"
                                      if isinstance(snapshot, dict) else "no snapshot")
                  + f" + {len(deltas)} delta object(s) up to {manifest.get('end')}")
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
    _print_inputs(inputs)
    for section in ("inputs", "outputs"):
        names = job.inputs if section == "inputs" else job.outputs
        for name in names:
            print(f"{section[:-1]} {name}: {stream_location(job, section, name)}")
    return 0
