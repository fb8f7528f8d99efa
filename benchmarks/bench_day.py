"""Wall time and peak memory of a simulated day: ``python -m sim workload=diurnal`` on an
autoscaled cluster (issue 21's target: a 24-hour day at a peak of 20 req/s in under 60 s).

    python benchmarks/bench_day.py [--overrides ...] [--tag x]

Runs ``python -m sim workload=diurnal cluster=autoscaled`` plus ``--overrides`` in a fresh
process into a temporary folder (every default output, plots included) and reports its wall
time, peak resident memory (``RUSAGE_CHILDREN``), requests, engine, GPU-hours, cost, the
simulated requests per second of wall time and the day hour by hour. Results go to stdout and
``benchmarks/results/bench_day[_<tag>].json``. Not a test: timings depend on the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
BASE = ["workload=diurnal", "cluster=autoscaled", "progress=false"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--overrides", nargs="*", default=[], help="config overrides of the run")
    ap.add_argument("--tag", default="", help="results file suffix")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run"
        args = [*BASE, *a.overrides, f"hydra.run.dir={out}"]
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "sim", *args], cwd=REPO, check=True,
                       capture_output=True, text=True)
        wall = time.perf_counter() - t0
        summary = json.loads((out / "summary.json").read_text())
    n = summary["completed"] + summary["rejected"] + summary.get("failed", 0)
    result = {"command": "python -m sim " + " ".join(args[:-1]), "wall_s": wall,
              "peak_rss_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024,
              "requests": n, "requests_per_wall_s": n / wall, "engine": summary["engine"],
              "gpu_hours": summary.get("gpu_hours"), "cost": summary.get("cost"),
              "mean_replicas": summary.get("mean_replicas"),
              "peak_replicas": summary.get("peak_replicas"),
              "slo_attainment": summary.get("slo_attainment"),
              "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
              "hourly": summary.get("hourly")}
    print(json.dumps(result, indent=2))
    path = HERE / "results" / f"bench_day{'_' + a.tag if a.tag else ''}.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
