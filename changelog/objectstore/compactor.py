"""The compactor subprocess: one writer's snapshots built off the writer's GIL.

``python -m localstate.changelog.objectstore.compactor`` reads frames on stdin and answers on stdout
(wire format and the writer's side: :mod:`.compactor_pipe`; the design and failure model are
described there and in docs/durable.md). It keeps a :class:`~.compaction.SnapshotBuilder`: fed
deltas are merged as they come; a snapshot request builds the snapshot, writes it to the store and
answers only once it is durable. It exits at EOF on stdin (the writer closed the pipe or died) and,
should a forked process keep an inherited copy of the pipe open, once its parent process is gone.
Nothing here is imported by the package (so ``-m`` runs it cleanly)."""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
import time
from pathlib import Path
from typing import IO, Any, Mapping

from localstate.errors import LocalStateError

from .chain import DELTA, SNAPSHOT, ChainObject, delta_name
from .compaction import SnapshotBuilder
from .compactor_pipe import DELTA_HEAD, FRAME, OP_ADOPT, OP_DELTA, OP_INIT, OP_SNAPSHOT, REPLY, object_from_json, \
    object_json

__all__ = ["serve", "main"]

#: How often the child checks that its parent process is still there.
ORPHAN_POLL_SECONDS = 1.0


def _read_exactly(source: IO[bytes], size: int) -> bytes | None:
    data = source.read(size)
    return data if len(data) == size else None


def _reply(out: IO[bytes], payload: Mapping[str, Any]) -> None:
    data = json.dumps(payload).encode()
    out.write(REPLY.pack(len(data)) + data)
    out.flush()


def _exit_when_orphaned(parent: int) -> None:
    """Exit once the parent is gone even if an inherited copy of the pipe keeps stdin open."""
    while True:
        time.sleep(ORPHAN_POLL_SECONDS)
        if os.getppid() != parent:
            os._exit(0)


def serve(source: IO[bytes], out: IO[bytes]) -> int:
    """The child's loop: frames from ``source`` until EOF, replies to ``out``."""
    from .storage import open_object_store  # noqa: PLC0415 - the child's only heavy import

    head = _read_exactly(source, FRAME.size)
    if head is None:
        return 0
    op, length = FRAME.unpack(head)
    if op != OP_INIT:
        raise SystemExit(f"compactor: expected an init frame, got {op!r}")
    init = json.loads(source.read(length))
    store = open_object_store(init["store"]["options"], Path(init["store"]["state_dir"]))
    builder = SnapshotBuilder(store, init["stream"], init["partition"], init["writer"])
    writer = init["writer"]
    while True:
        head = _read_exactly(source, FRAME.size)
        if head is None:
            return 0  # EOF: the parent closed the pipe or died
        op, length = FRAME.unpack(head)
        payload = _read_exactly(source, length)
        if payload is None:
            return 0
        if op == OP_DELTA:
            epoch, start, end = DELTA_HEAD.unpack_from(payload, 0)
            delta = ChainObject(delta_name(start, end, writer), DELTA, start, end, end - start, 0, writer)
            builder.feed(epoch, delta, payload[DELTA_HEAD.size:])
        elif op == OP_ADOPT:
            request = json.loads(payload)
            builder.adopt(request["epoch"], request["fresh"])
        elif op == OP_SNAPSHOT:
            request = json.loads(payload)
            try:
                snapshot, _body = builder.build([object_from_json(raw) for raw in request["objects"]], request["epoch"])
            except LocalStateError as exc:
                _reply(out, {"ok": False, "error": exc.message, "path": exc.context.get("path")})
                continue
            assert snapshot.kind == SNAPSHOT
            _reply(out, {"ok": True, "snapshot": object_json(snapshot)})
        else:
            raise SystemExit(f"compactor: unknown frame {op!r}")


def main() -> int:
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="localstate compactor %(process)d: %(levelname)s %(message)s")
    threading.Thread(target=_exit_when_orphaned, args=(os.getppid(),), name="orphan-watch", daemon=True).start()
    out = sys.stdout.buffer
    sys.stdout = sys.stderr  # stdout carries replies only: a stray print must not corrupt the protocol
    return serve(sys.stdin.buffer, out)


if __name__ == "__main__":
    sys.exit(main())
