"""Tasks that fail in each of the places a task's code runs (imported by the Python workers).

Line numbers matter: the tests look for ``failing_tasks.py:<line>`` of the raising statement, found
by searching this file for the marker comment on that line.
"""

from __future__ import annotations

from localstate.core.task import StreamTask


def _parse_amount(value: dict) -> int:
    return int(value["amount"])  # MARK: process


class RaiseInProcess(StreamTask):
    def init(self, context) -> None:
        # One line per attempt: a task bug must not be retried by Spark.
        with open(f"{context.config.state_dir}/attempts", "a") as attempts:
            attempts.write("attempt\n")

    def process(self, envelope, collector, coordinator) -> None:
        _parse_amount({"amount": "not a number"})


class RaiseInInit(StreamTask):
    def init(self, context) -> None:
        self.threshold = context.config.spark["threshold"]  # MARK: init

    def process(self, envelope, collector, coordinator) -> None:
        pass


class RaiseInConstructor(StreamTask):
    def __init__(self) -> None:
        raise RuntimeError("the model file is missing")  # MARK: constructor

    def process(self, envelope, collector, coordinator) -> None:
        pass


def _depth(n: int) -> int:
    return _depth(n + 1) + 1  # MARK: recursion


class Recurse(StreamTask):
    def process(self, envelope, collector, coordinator) -> None:
        _depth(0)


class Overflow(StreamTask):
    def process(self, envelope, collector, coordinator) -> None:
        collector.send("out", envelope.key, float(10 ** 400))  # MARK: overflow


class MissingStore(StreamTask):
    def init(self, context) -> None:
        self.counts = context.store("no-such-store")  # MARK: store

    def process(self, envelope, collector, coordinator) -> None:
        pass


class UnencodableOutput(StreamTask):
    """Fails outside its own code: the jsonl output cannot encode the value when the batch commits."""

    def process(self, envelope, collector, coordinator) -> None:
        collector.send("out", envelope.key, {1, 2, 3})


class KillsItsWorker(StreamTask):
    """Kills its Python worker on every attempt: nothing Python can catch."""

    def process(self, envelope, collector, coordinator) -> None:
        import os
        import signal

        os.kill(os.getpid(), signal.SIGKILL)
