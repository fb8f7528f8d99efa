"""Speed and memory of a whole trace replayed on a cluster of replicas.

    python benchmarks/bench_trace.py [--trace ../shared/traces/mooncake_conversation.csv]
        [--replicas 8] [--overrides cluster.router=prefix_affinity] [--tag mooncake_8]

Replays every request of the trace (its own arrival times and lengths, its ``hash_ids`` for
the prefix cache) on ``replicas`` replicas of the default model and GPU with prefix caching,
in a fresh process, and reports the wall time of building the requests and simulating,
simulated requests per wall second and the peak resident memory of that process, with the
machine's load average before and after. Results go to stdout and
``benchmarks/results/bench_trace[_<tag>].json``. Not a test: timings depend on the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from pathlib import Path

from bench_default import run_child, run_once

HERE = Path(__file__).resolve().parent
TRACE = HERE.parent.parent / "shared" / "traces" / "mooncake_conversation.csv"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", type=Path, default=TRACE)
    ap.add_argument("--replicas", type=int, default=8)
    ap.add_argument("--overrides", nargs="*", default=[], help="more config overrides")
    ap.add_argument("--tag", default="", help="results file suffix")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if not a.trace.is_file():
        print(f"no trace at {a.trace} (the shared data is not next to this checkout)",
              file=sys.stderr)
        return 2
    overrides = ["workload=trace", f"workload.trace_path={a.trace.resolve()}",
                 f"cluster.replicas={a.replicas}", "kv_cache.prefix_caching=true"] + a.overrides
    if a.child:
        print(json.dumps(run_once(overrides)))
        return 0
    # the results name the trace relative to the project, not this machine's folders
    overrides[1] = f"workload.trace_path={os.path.relpath(a.trace.resolve(), HERE.parent)}"
    r = run_child(__file__, ["--child", "--trace", str(a.trace), "--replicas", str(a.replicas),
                             "--overrides", *a.overrides])
    print(f"{a.trace.name} on {a.replicas} replicas: simulate {r['simulate_s']:.1f} s + build "
          f"{r['build_s']:.1f} s, {r['completed']} requests ({r['requests_per_wall_s']:.0f} "
          f"req/s), {r['steps']} steps, peak RSS {r['peak_rss_mb']:.0f} MB, load "
          f"{r['load_average'][0]:.2f}→{r['load_average'][1]:.2f}")
    doc = {"machine": f"{platform.processor() or platform.machine()}, {platform.python_version()}",
           "cpus": os.cpu_count(), "trace": a.trace.name, "overrides": overrides, "run": r}
    (HERE / "results").mkdir(exist_ok=True)
    name = f"bench_trace_{a.tag}.json" if a.tag else "bench_trace.json"
    (HERE / "results" / name).write_text(json.dumps(doc, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
