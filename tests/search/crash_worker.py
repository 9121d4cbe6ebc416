"""Kill -9 victim: indexes stdlib paragraphs into a search store with a durable changelog,
flushing every few documents and recording the flushed offset (the "checkpoint") after each flush.
Runs until killed. Usage: crash_worker.py WORKDIR MODE SEED ROUND  (MODE: add | mixed)."""

from __future__ import annotations

import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from search_support import corpus, durable_changelog, open_engine, read_checkpoint, recover, write_checkpoint  # noqa: E402


def main() -> None:
    workdir, mode, seed, round_ = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    rng = random.Random(seed * 1000 + round_)
    docs = corpus(1500)
    changelog = durable_changelog(workdir / "changelog")
    engine = open_engine(workdir / "store", changelog)
    checkpoint_file = workdir / "checkpoint"
    recover(engine, changelog, read_checkpoint(checkpoint_file))
    write_checkpoint(checkpoint_file, engine.local_offset())
    i = 0
    while True:
        i += 1
        if mode == "add":  # unique ids: the index never holds deleted documents
            engine.add(f"r{round_}-{i:06d}", docs[rng.randrange(len(docs))])
        else:
            doc_id = f"d{rng.randrange(400):03d}"
            if rng.random() < 0.2:
                engine.delete(doc_id)
            else:
                doc = dict(docs[rng.randrange(len(docs))])
                doc["body"] += f" revision{i}"
                engine.add(doc_id, doc)
        if i % 20 == 0:
            engine.flush()
            write_checkpoint(checkpoint_file, engine.local_offset())
            print(engine.local_offset(), flush=True)


if __name__ == "__main__":
    main()
