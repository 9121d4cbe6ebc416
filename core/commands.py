"""Subcommands of the ``localstate`` CLI that belong to the core: ``plugins`` and ``validate``."""

from __future__ import annotations

import argparse

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
    job = load_job_config(args.job, plugins=args.plugins)
    print(f"{args.job}: ok — job {job.name!r}, {job.partitions} partition(s), "
          f"{len(job.stores)} store(s), {len(job.inputs)} input(s), {len(job.outputs)} output(s)")
    return 0


validate.arguments = lambda parser: parser.add_argument("job", help="job config (TOML)")  # type: ignore[attr-defined]
