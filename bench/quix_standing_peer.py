"""Quix Streams' standing count per key, the peer of ``bench standing --inputs kafka`` (run by a Python
that has quixstreams, as a separate process; never imported by localstate).

Reads ``--input`` (key: the user as a string, value: JSON), keeps a count per key in Quix's RocksDB
state (with its changelog topic), and sends each record's new count to ``--output`` (key: the user,
value: the count as JSON): the counting logic of the bench's localstate job, record at a time.
``--guarantee exactly-once`` makes Quix consume read-committed and produce in a transaction per
checkpoint, committed every ``--commit-interval`` seconds: that is when its outputs become visible to
a read_committed reader. Runs until SIGTERM (Quix's own handler stops it after the current checkpoint).
"""

import argparse
import logging
import warnings

warnings.filterwarnings("ignore")

from quixstreams import Application  # noqa: E402


def count(value: dict, state) -> int:
    """The key's new count (every record counts one, as the localstate task does)."""
    n = (state.get("count") or 0) + 1
    state.set("count", n)
    return n


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--servers", required=True)
    parser.add_argument("--input", required=True)
    parser.add_argument("--output", required=True)
    parser.add_argument("--group", required=True, help="consumer group (one per run)")
    parser.add_argument("--state-dir", required=True)
    parser.add_argument("--guarantee", default="exactly-once", choices=("exactly-once", "at-least-once"))
    parser.add_argument("--commit-interval", type=float, default=0.1, help="seconds between checkpoints")
    args = parser.parse_args()
    app = Application(broker_address=args.servers, consumer_group=args.group, auto_offset_reset="earliest",
                      processing_guarantee=args.guarantee, commit_interval=args.commit_interval,
                      state_dir=args.state_dir, loglevel=logging.WARNING)
    events = app.topic(args.input, key_deserializer="str", value_deserializer="json")
    counts = app.topic(args.output, key_serializer="str", value_serializer="json")
    sdf = app.dataframe(events)
    sdf = sdf.apply(count, stateful=True)
    sdf.to_topic(counts)
    print("started", flush=True)
    app.run()


if __name__ == "__main__":
    main()
