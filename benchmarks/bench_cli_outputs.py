"""Wall time and peak memory of ``python -m sim`` with its default outputs, as a user runs it.

    python benchmarks/bench_cli_outputs.py [--sizes 100000 1000000] [--overrides ...] [--tag x]

Each size runs ``python -m sim workload.num_requests=N`` (the default chat workload, every
output: requests.parquet, timeline.parquet, summary.json and the plots) in a fresh process
into a temporary folder, and reports its wall time, the peak resident memory of that process
(``RUSAGE_CHILDREN``, measured one size per fresh parent so sizes do not mask each other),
the timeline rows written and the exponent b of time ∝ N^b. Results go to stdout and
``benchmarks/results/bench_cli_outputs[_<tag>].json``. Not a test: timings depend on the
machine.
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

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parent


def run_size(n: int, overrides: list[str]) -> dict:
    """One ``python -m sim`` run of ``n`` requests: wall time, peak RSS, rows written."""
    import pyarrow.parquet as pq

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run"
        load_before = os.getloadavg()[0]
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "sim", f"workload.num_requests={n}",
                        f"hydra.run.dir={out}", "progress=false", *overrides],
                       cwd=REPO, check=True, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
        summary = json.loads((out / "summary.json").read_text())
        rows = pq.ParquetFile(out / "timeline.parquet").metadata.num_rows \
            if (out / "timeline.parquet").exists() else 0
    return {"requests": n, "wall_s": wall, "peak_rss_mb": rss, "timeline_rows": rows,
            "completed": summary.get("completed"), "engine": summary.get("engine"),
            "load_average": [load_before, os.getloadavg()[0]]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[100_000, 1_000_000])
    ap.add_argument("--overrides", nargs="*", default=[], help="config overrides of every run")
    ap.add_argument("--tag", default="", help="results file suffix")
    ap.add_argument("--child", type=int, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child is not None:
        print(json.dumps(run_size(a.child, a.overrides)))
        return 0
    rows = []
    for n in a.sizes:  # a fresh parent per size: RUSAGE_CHILDREN is a running maximum
        out = subprocess.run([sys.executable, __file__, "--child", str(n), "--overrides",
                              *a.overrides], check=True, capture_output=True, text=True).stdout
        r = json.loads(out.strip().splitlines()[-1])
        rows.append(r)
        print(f"{n:>9} requests: {r['wall_s']:.1f} s, peak RSS {r['peak_rss_mb']:.0f} MB, "
              f"{r['timeline_rows']} timeline rows, engine {r['engine']}")
    result = {"machine": platform.platform(), "cpus": os.cpu_count(),
              "overrides": a.overrides, "runs": rows}
    if len(rows) > 1:
        n = np.log([r["requests"] for r in rows])
        t = np.log([r["wall_s"] for r in rows])
        result["time_exponent"] = float(np.polyfit(n, t, 1)[0])
        print(f"time ∝ N^{result['time_exponent']:.2f}")
    name = "bench_cli_outputs" + (f"_{a.tag}" if a.tag else "") + ".json"
    (HERE / "results" / name).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
