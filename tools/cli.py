"""The ``localstate`` command line.

Exit codes: 0 success (``localstate run`` stopped by SIGTERM or SIGINT included), 1 a localstate error
(message on stderr), 2 usage error, 130 interrupted (Ctrl-C outside a run's batches, or a second
SIGINT during a run's stop), 143 a second SIGTERM during a run's stop.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from typing import Any, Callable, Sequence

from localstate.errors import LocalStateError, TaskImportInterrupted
from localstate import __version__
from localstate.core.config import load_job_config
from localstate.native import status
from localstate.runtime.layout import resolve_epoch

__all__ = ["main", "build_parser", "command", "load_job", "positive_int", "partition_count"]

_COMMANDS: dict[str, tuple[Callable[[argparse.Namespace], int], str]] = {}


def command(name: str, help: str) -> Callable:  # noqa: A002 - argparse's own word
    """Register ``localstate <name>``: decorate ``run(args) -> int``; set ``run.arguments`` to a
    function that adds the command's flags to its parser."""

    def register(run: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
        _COMMANDS[name] = (run, help)
        return run

    return register


def positive_int(text: str) -> int:
    """argparse type of counts that must be >= 1 (``--batches``, ``--batch-size``, ...): anything
    else is a usage error (exit 2) naming the flag, never a silent no-op run."""
    try:
        value = int(text, 10)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def partition_count(text: str) -> int:
    """argparse type of a job's partition count: 1 to 100000, as ``job.partitions``."""
    value = positive_int(text)
    if value > 100_000:
        raise argparse.ArgumentTypeError(f"must be from 1 to 100000, got {value}")
    return value


def load_job(args: argparse.Namespace) -> Any:
    """The job file ``args.job`` (under ``args.plugins``), bound to its current state epoch: what every
    command that reads or writes the job's state works on (docs/state-as-data.md)."""
    return resolve_epoch(load_job_config(args.job, plugins=args.plugins))


def _version() -> str:
    """The version, and which optional C extensions are in use (``localstate.native``)."""
    extensions = ", ".join(f"{name.rsplit('.', 1)[-1].lstrip('_')} {state}" for name, state in status().items())
    return f"{__version__} (C extensions: {extensions})"


class _PrintVersion(argparse.Action):
    """``--version``: one line, as is (argparse's own version action wraps it at the terminal's width,
    which split "sorting in use" over two lines)."""

    def __init__(self, option_strings: list[str], dest: str = argparse.SUPPRESS, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        print(f"localstate {_version()}")
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    _load_commands()
    parser = argparse.ArgumentParser(prog="localstate", description=(
        "Fast, fault-tolerant local state for stream processing on Spark."))
    parser.add_argument("--version", action=_PrintVersion, help="show the version and which C extensions are in use")
    parser.add_argument("--plugins", metavar="FILE", help="operator plugin policy file; wins over any job's own "
                        "(default: $LOCALSTATE_PLUGINS, else the job's [job] plugins or plugins.toml next to "
                        "the job file, else the open default; see docs/plugins.md)")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more log output (-vv for debug)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (run, help_text) in sorted(_COMMANDS.items()):
        add_arguments = getattr(run, "arguments", None)
        subparser = sub.add_parser(name, help=help_text, description=help_text)
        if add_arguments is not None:
            add_arguments(subparser)
    return parser


_COMMAND_MODULES = ("localstate.tools.commands", "localstate.tools.run", "localstate.tools.status",
                    "localstate.tools.statedata", "localstate.demo.commands")


def _load_commands() -> None:
    # Commands live next to what they drive; importing the modules registers them.
    for module in _COMMAND_MODULES:
        importlib.import_module(module)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=(logging.WARNING, logging.INFO, logging.DEBUG)[min(args.verbose, 2)],
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not args.command:
        parser.print_help()
        return 2
    run = _COMMANDS[args.command][0]
    try:
        return run(args)
    except LocalStateError as exc:
        print(f"localstate {args.command}: error: {exc}", file=sys.stderr)
        _print_traceback(exc, args.verbose)
        return 1
    except KeyboardInterrupt as exc:
        # TaskImportInterrupted says what was still importing: "interrupted while importing task module ..."
        print(f"localstate {args.command}: {exc if isinstance(exc, TaskImportInterrupted) else 'interrupted'}",
              file=sys.stderr)
        return 130


def _print_traceback(error: LocalStateError, verbose: int) -> None:
    """Where Python code failed, if it did: the user's frames (the full traceback with ``-v``)."""
    text = error.traceback if verbose else error.traceback_summary
    if text:
        more = "" if verbose else "\n(run with -v for the full traceback)" if error.traceback != text else ""
        print(text.rstrip("\n") + more, file=sys.stderr)


if __name__ == "__main__":
    # Run through the imported module so commands register in one table (not in __main__'s copy).
    from localstate.tools import cli

    sys.exit(cli.main())
