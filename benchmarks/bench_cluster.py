"""Speed and memory of many replicas behind a router on the default chat workload.

    python benchmarks/bench_cluster.py [--replicas 64] [--requests 100000] [--load 0.8]
        [--overrides cluster.router=least_loaded] [--tag 64]

The request rate is ``load`` × ``replicas`` × the sustainable rate of one replica (found as in
``bench_default.py``: a saturated closed loop of one replica), so every replica runs near
saturation as in the single-replica benchmark. Runs in a fresh process and reports the wall
time of building the requests and simulating, simulated requests per wall second and peak
resident memory, with the machine's load average before and after. Results go to stdout and
``benchmarks/results/bench_cluster[_<tag>].json``. Not a test: timings depend on the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
from pathlib import Path

from bench_default import run_child, run_once, sustainable_rate

HERE = Path(__file__).resolve().parent


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--replicas", type=int, default=64)
    ap.add_argument("--requests", type=int, default=100_000)
    ap.add_argument("--load", type=float, default=0.8)
    ap.add_argument("--overrides", nargs="*", default=[], help="more config overrides")
    ap.add_argument("--tag", default="", help="results file suffix")
    ap.add_argument("--child", type=float, metavar="RATE", help=argparse.SUPPRESS)
    a = ap.parse_args()
    overrides = ["workload=chat", f"workload.num_requests={a.requests}",
                 f"cluster.replicas={a.replicas}"] + a.overrides
    if a.child is not None:
        print(json.dumps(run_once(overrides + [f"workload.rate={a.child}"])))
        return 0
    one = sustainable_rate(a.overrides)
    rate = round(a.load * a.replicas * one, 3)
    print(f"one replica sustains {one:.2f} req/s; {a.replicas} replicas at {a.load:.0%} = "
          f"{rate} req/s")
    r = run_child(__file__, ["--child", str(rate), "--replicas", str(a.replicas),
                             "--requests", str(a.requests), "--overrides", *a.overrides])
    print(f"{a.requests} requests on {a.replicas} replicas: simulate {r['simulate_s']:.1f} s + "
          f"build {r['build_s']:.1f} s ({r['requests_per_wall_s']:.0f} req/s), {r['steps']} "
          f"steps, peak RSS {r['peak_rss_mb']:.0f} MB, achieved {r['request_throughput']:.1f} "
          f"req/s, median TTFT {r['median_ttft_ms']:.0f} ms, TPOT {r['median_tpot_ms']:.1f} ms, "
          f"load {r['load_average'][0]:.2f}→{r['load_average'][1]:.2f}")
    doc = {"machine": f"{platform.processor() or platform.machine()}, {platform.python_version()}",
           "cpus": os.cpu_count(), "overrides": overrides, "one_replica_rate": one,
           "rate": rate, "load": a.load, "run": r}
    (HERE / "results").mkdir(exist_ok=True)
    name = f"bench_cluster_{a.tag}.json" if a.tag else "bench_cluster.json"
    (HERE / "results" / name).write_text(json.dumps(doc, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
