"""Write the search-index job's input: deterministic listings and saved searches as JSON lines.

    python examples/search_index/make_input.py [--listings N] [--searches N] [--seed S]

Thirty minutes of a second-hand marketplace. Listing events are new listings (titles like
"Vintage red bike, with pump"), price drops of open listings (the whole listing again, cheaper)
and sales (``{"id", "sold": true}``: the listing is withdrawn). Saved searches arrive during the
first twenty minutes; each is a query string plus the same search in structured form (``terms``,
``category``, ``max_price``) so that a reader can check the results without a search engine.

Listings go to ``<listings path>/<partition>.jsonl`` with ``partition = partition_for(id,
partitions)`` (the Kafka-compatible partitioner); every saved search goes to every partition's
``<saved-searches path>/<partition>.jsonl`` (each partition's index is one shard of the listings,
so each must run every search). Both in event-time order. Paths and the partition count come from
the ``job.toml`` next to this file. Refuses to write twice: delete the example's ``.work/``
folder to start from scratch.
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path
from typing import Any

from localstate.core.config import load_job_config
from localstate.streams.jsonl import by_key_partition, write_jsonl
from localstate.core.stream import resolve_path

__all__ = ["listing_events", "saved_searches", "write_input", "main", "CATEGORIES", "COLORS", "CONDITIONS"]

START_TS = 1_700_000_040.0  # on a minute boundary: windows line up with the minutes
MINUTES = 30
SEARCH_MINUTES = 20
CATEGORIES = {
    "bikes": ["bike", "helmet", "saddle", "wheel", "pump"],
    "phones": ["phone", "charger", "case", "screen", "cable"],
    "furniture": ["chair", "table", "lamp", "sofa", "shelf"],
}
COLORS = ["red", "blue", "green", "black", "white", "silver"]
CONDITIONS = ["new", "used", "vintage", "refurbished"]


def listing_events(events: int, seed: int) -> list[tuple[float, str, dict[str, Any]]]:
    """``(ts, listing id, value)`` in time order, evenly spread over ``MINUTES`` minutes."""
    rng = random.Random(seed)
    open_listings: dict[str, dict[str, Any]] = {}
    out = []
    for i in range(events):
        ts = START_TS + i * MINUTES * 60.0 / events
        roll = rng.random()
        if open_listings and roll < 0.12:  # sold: withdrawn from the index
            listing_id = rng.choice(sorted(open_listings))
            del open_listings[listing_id]
            out.append((ts, listing_id, {"id": listing_id, "sold": True}))
            continue
        if open_listings and roll < 0.30:  # price drop: the same listing, cheaper, now "changed"
            listing_id = rng.choice(sorted(open_listings))
            listing = dict(open_listings[listing_id])
            listing["price"] = max(1, listing["price"] * rng.randrange(60, 95) // 100)
        else:
            category = rng.choice(sorted(CATEGORIES))
            item = rng.choice(CATEGORIES[category])
            # Capitals and punctuation on purpose: matching is on lower-cased words.
            title = f"{rng.choice(CONDITIONS).capitalize()} {rng.choice(COLORS)} {item}"
            if rng.random() < 0.4:
                title += f", with {rng.choice(CATEGORIES[category])}!"
            listing_id = f"listing-{i:05d}"
            listing = {"id": listing_id, "title": title, "category": category, "price": rng.randrange(5, 500)}
        open_listings[listing_id] = listing
        out.append((ts, listing_id, listing))
    return out


def saved_searches(count: int, seed: int) -> list[tuple[float, str, dict[str, Any]]]:
    """``(ts, search id, value)`` in time order, spread over the first ``SEARCH_MINUTES`` minutes."""
    rng = random.Random(seed + 1)
    words = COLORS + CONDITIONS + [item for items in CATEGORIES.values() for item in items]
    out = []
    for i in range(count):
        ts = START_TS + rng.uniform(0, SEARCH_MINUTES * 60.0)
        terms = rng.sample(words, rng.choice([1, 1, 2]))
        category = rng.choice(sorted(CATEGORIES)) if rng.random() < 0.3 else None
        max_price = rng.choice([50, 100, 250]) if rng.random() < 0.4 else None
        clauses = terms + ([f"category:{category}"] if category else []) \
            + ([f"price:[0 TO {max_price}]"] if max_price is not None else [])
        search_id = f"search-{i:03d}"
        out.append((ts, search_id, {"id": search_id, "user": f"user-{rng.randrange(100):03d}",
                                    "query": " AND ".join(clauses), "terms": terms, "category": category,
                                    "max_price": max_price}))
    return sorted(out, key=lambda row: row[0])


def write_input(job_file: Path, listings: int = 3000, searches: int = 24, seed: int = 3) -> list[Path]:
    """Write the inputs of the job in ``job_file``; returns the two input directories."""
    job = load_job_config(job_file)
    listing_dir = resolve_path(job, job.inputs["listings"].options["path"])
    search_dir = resolve_path(job, job.inputs["saved_searches"].options["path"])
    for directory in (listing_dir, search_dir):
        if directory.exists() and any(directory.iterdir()):
            raise SystemExit(f"{directory} already has input; `localstate reset JOB --yes` starts the job over on it, deleting .work/ starts from scratch")
    by_partition = by_key_partition(({"key": listing_id, "value": value, "ts": ts}
                                     for ts, listing_id, value in listing_events(listings, seed)), job.partitions)
    searches_rows = [{"key": search_id, "value": value, "ts": ts}
                     for ts, search_id, value in saved_searches(searches, seed)]
    for partition in range(job.partitions):
        write_jsonl(listing_dir, partition, by_partition[partition])
        write_jsonl(search_dir, partition, searches_rows)
    return [listing_dir, search_dir]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="make_input.py", description=__doc__.split("\n")[0])
    parser.add_argument("--listings", type=int, default=3000)
    parser.add_argument("--searches", type=int, default=24)
    parser.add_argument("--seed", type=int, default=3)
    args = parser.parse_args(argv)
    listing_dir, search_dir = write_input(Path(__file__).resolve().parent / "job.toml", args.listings,
                                          args.searches, args.seed)
    print(f"wrote {args.listings:,} listing events to {listing_dir} and {args.searches} saved searches to {search_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
