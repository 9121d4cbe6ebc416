"""Render docs/images/grafana-dashboard.png: the panels of localstate-dashboard.json, drawn with
matplotlib from a real run's Prometheus scrapes.

It starts a standing ``localstate run`` of a small counting job (a jsonl input that grows while the
job runs, with a few bad lines skipped) with ``[job] metrics_port`` set, scrapes ``/metrics`` every
``--every`` seconds for ``--seconds``, stops the job with SIGTERM, and evaluates each panel's queries
on the scrapes: ``rate()`` of a counter between scrapes, ``histogram_quantile`` of a histogram's
bucket increases, gauges as they are, summed by the panel's legend labels. A query whose metric the
run does not serve is drawn as "no data", as Grafana would. Needs matplotlib (``pip install -e
'.[dashboard]'``)::

    python contrib/grafana/render_screenshot.py                # about two minutes
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
DASHBOARD = HERE / "localstate-dashboard.json"
WALL = "__wall_clock__"
OUT = ROOT / "docs" / "images" / "grafana-dashboard.png"

TASK = '''
from localstate import StreamTask


class CountPages(StreamTask):
    def init(self, context):
        self.counts = context.store("counts")

    def process(self, envelope, collector, coordinator):
        page = envelope.value["page"]
        total = (self.counts.get(page) or 0) + 1
        self.counts.put(page, total)
        if total % 10 == 0:
            collector.send("totals", page, total)
'''

JOB = '''
[job]
name = "page-counts"
partitions = 2
task = "pages:CountPages"
state_dir = "state"
metrics_port = {port}

[inputs.views]
system = "jsonl"
path = "in"
on_error = "skip"

[outputs.totals]
system = "jsonl"
path = "out"

[stores.counts]
engine = "kv"
key_serde = "string"
value_serde = "int"

[spark]
master = "local[2]"
batch_size = 500
trigger = "1s"
'''


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float] | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            text = response.read().decode()
    except OSError:
        return None
    samples = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        series, value = line.rsplit(" ", 1)
        name, _, labels = series.partition("{")
        pairs = tuple(sorted(re.findall(r'(\w+)="([^"]*)"', labels)))
        samples[(name, pairs)] = float(value)
    return samples


def append(folder: Path, rng: random.Random, count: int) -> None:
    for partition in (0, 1):
        with open(folder / f"{partition}.jsonl", "a", encoding="utf-8") as handle:
            for _ in range(count):
                if rng.random() < 0.01:
                    handle.write('{"key": "broken", "value": \n')  # a bad line: skipped
                else:
                    page = f"/p/{int(rng.paretovariate(1.2)) % 40}"
                    handle.write(json.dumps({"key": f"user-{rng.randrange(500)}", "value": {"page": page}}) + "\n")


def run(seconds: float, every: float) -> list[tuple[float, dict]]:
    """Scrapes ``(seconds since start, samples)`` of a standing run fed while it runs."""
    rng = random.Random(7)
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="localstate-dashboard-") as tmp:
        folder = Path(tmp)
        (folder / "pages.py").write_text(TASK)
        (folder / "job.toml").write_text(JOB.format(port=port))
        (folder / "in").mkdir()
        append(folder / "in", rng, 2000)
        job = subprocess.Popen([sys.executable, "-m", "localstate.tools.cli", "run", "job.toml"], cwd=folder,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        scrapes: list[tuple[float, dict]] = []
        try:
            deadline = time.monotonic() + 600  # Spark's start and the first batch: the series begin there
            while not scrape(port) and job.poll() is None and time.monotonic() < deadline:
                time.sleep(1.0)
            started = time.monotonic()
            while time.monotonic() - started < seconds and job.poll() is None:
                time.sleep(every)
                elapsed = time.monotonic() - started
                # a load that rises and falls: a burst in the middle of the run
                burst = 1.0 + 3.0 * math.exp(-((elapsed / seconds - 0.55) ** 2) / 0.01)
                append(folder / "in", rng, int(150 * every * burst))
                samples = scrape(port)
                if samples:
                    samples[(WALL, ())] = time.time()  # what time() is in a query evaluated at this scrape
                    scrapes.append((elapsed, samples))
        finally:
            job.send_signal(signal.SIGTERM)
            output, _ = job.communicate(timeout=120)
        print(output.strip().splitlines()[-4] if output.strip() else "(no output)")
    if not scrapes:
        raise SystemExit("no scrape succeeded: did the run start? (its output is above)")
    return scrapes


# -- the panels' queries, evaluated on the scrapes -----------------------------------------------------

def _groups(expr: str) -> tuple[str, ...]:
    found = re.search(r"sum by \(([\w, ]+)\)", expr)
    return tuple(g.strip() for g in found.group(1).split(",")) if found else ()


def _series(scrapes, metric: str, by: tuple[str, ...]) -> dict[tuple, list[tuple[float, float]]]:
    out: dict[tuple, list[tuple[float, float]]] = {}
    for at, samples in scrapes:
        summed: dict[tuple, float] = {}
        for (name, labels), value in samples.items():
            if name == metric:
                key = tuple(v for k, v in labels if k in by)
                summed[key] = summed.get(key, 0.0) + value
        for key, value in summed.items():
            out.setdefault(key, []).append((at, value))
    return out


def _rate(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    return [(t1, max(0.0, v1 - v0) / (t1 - t0)) for (t0, v0), (t1, v1) in zip(points, points[1:]) if t1 > t0]


def _quantile(scrapes, metric: str, q: float) -> list[tuple[float, float]]:
    per_le = _series(scrapes, f"{metric}_bucket", ("le",))
    if not per_le:
        return []
    times = [t for t, _ in next(iter(per_le.values()))]
    out = []
    for i in range(1, len(times)):
        increase = sorted((float(le[0]), points[i][1] - points[i - 1][1]) for le, points in per_le.items())
        total = increase[-1][1]
        if total <= 0:
            continue
        previous_bound, previous_count = 0.0, 0.0
        for bound, count in increase:  # Prometheus' linear interpolation inside the bucket
            if count >= q * total:
                if math.isinf(bound):
                    out.append((times[i], previous_bound))
                else:
                    share = (q * total - previous_count) / max(count - previous_count, 1e-12)
                    out.append((times[i], previous_bound + (bound - previous_bound) * share))
                break
            previous_bound, previous_count = bound, count
    return out


def evaluate(expr: str, legend: str, scrapes) -> dict[str, list[tuple[float, float]]]:
    """The series of one query (the forms the dashboard uses), keyed by its legend."""
    def name(key: tuple, by: tuple[str, ...]) -> str:
        text = legend
        for label, value in zip(by, key):
            text = text.replace("{{" + label + "}}", value)
        return text

    quantile = re.match(r"histogram_quantile\(([\d.]+), sum by \(le\) \(rate\((\w+)_bucket", expr)
    if quantile:
        points = _quantile(scrapes, quantile.group(2), float(quantile.group(1)))
        return {legend: points} if points else {}
    if expr.startswith("time() - "):
        metric = re.search(r"(localstate_\w+)", expr).group(1)
        last = _series(scrapes, metric, ())
        walls = dict((t, s[(WALL, ())]) for t, s in scrapes)
        return {legend: [(t, walls[t] - v) for t, v in last[()]]} if last else {}
    if " / clamp_min(" in expr:  # the warm ratio
        warm = _series(scrapes, "localstate_warm_tasks", ())
        cold = _series(scrapes, "localstate_cold_tasks", ())
        if not warm or not cold:
            return {}
        return {legend: [(t, w / max(w + c, 1.0)) for (t, w), (_, c) in zip(warm[()], cold[()])]}
    metric = re.search(r"(localstate_\w+)", expr).group(1)
    explicit = re.search(r"\{\{", legend)
    by = _groups(expr) or (tuple(re.findall(r"\{\{(\w+)\}\}", legend)) if explicit else ())
    series = _series(scrapes, metric, by)
    scale = 60.0 if expr.endswith("* 60") else 1.0
    out = {}
    for key, points in series.items():
        values = _rate(points) if "rate(" in expr else points
        out[name(key, by)] = [(t, v * scale) for t, v in values]
    return out


def render(scrapes, path: Path) -> None:
    import matplotlib  # optional dependency (the dashboard extra)

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # after matplotlib.use("Agg"): pyplot takes the backend set first

    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    panels = sorted(dashboard["panels"], key=lambda p: (p["gridPos"]["y"], p["gridPos"]["x"]))
    columns = 3
    rows = math.ceil(len(panels) / columns)
    plt.style.use("dark_background")
    figure, axes = plt.subplots(rows, columns, figsize=(15, 3.0 * rows), squeeze=False)
    figure.patch.set_facecolor("#111217")
    figure.suptitle(f"{dashboard['title']}: job page-counts, a standing run on local[2], scraped every "
                    f"{scrapes[1][0] - scrapes[0][0]:.0f}s", color="#ccccdc", fontsize=12, x=0.01, ha="left")
    for axis, panel in zip(axes.flat, panels):
        axis.set_facecolor("#181b1f")
        axis.set_title(panel["title"], loc="left", fontsize=10, color="#ccccdc")
        axis.tick_params(colors="#8e8e8e", labelsize=7)
        for spine in axis.spines.values():
            spine.set_color("#2c3235")
        drawn = 0
        for target in panel["targets"]:
            for label, points in evaluate(target["expr"], target["legendFormat"], scrapes).items():
                if points:
                    axis.plot([t for t, _ in points], [v for _, v in points], linewidth=1.2, label=label)
                    drawn += 1
        if drawn:
            axis.legend(fontsize=7, loc="upper left", frameon=False, labelcolor="#ccccdc")
            axis.set_ylim(bottom=0)
        else:
            axis.text(0.5, 0.5, "No data", ha="center", va="center", color="#8e8e8e", transform=axis.transAxes)
        unit = panel["fieldConfig"]["defaults"].get("unit", "")
        axis.set_ylabel({"s": "seconds", "bytes": "bytes", "rowsps": "rows/s", "percentunit": "ratio"}.get(unit, ""),
                        fontsize=7, color="#8e8e8e")
        axis.set_xlabel("seconds into the run", fontsize=7, color="#8e8e8e")
    for axis in list(axes.flat)[len(panels):]:
        axis.set_visible(False)
    figure.tight_layout(rect=(0, 0, 1, 0.97))
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=80, facecolor=figure.get_facecolor())
    print(f"wrote {path}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=90.0, help="how long the job runs, scraped")
    parser.add_argument("--every", type=float, default=3.0, help="seconds between scrapes")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    render(run(args.seconds, args.every), args.out)


if __name__ == "__main__":
    main()
