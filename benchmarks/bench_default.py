"""Speed and memory of the default chat workload on one replica near saturation.

    python benchmarks/bench_default.py [--sizes 10000 30000 100000] [--load 0.8]
        [--overrides scheduler=sglang kv_cache.prefix_caching=true] [--tag sglang_prefix]
        [--profile]

1. Finds the sustainable rate of one replica (Llama-3.1-8B, H100, vLLM scheduler, chat
   lengths) as the request throughput of a saturated closed loop (1024 clients).
2. Runs the open-loop Poisson chat workload at ``load`` × that rate for each size, each in a
   fresh process, and reports wall time of building the requests and simulating, simulated
   requests per wall second, and peak resident memory of that process.
3. Fits the exponent b of time ∝ N^b (1 = linear).
4. With ``--profile``, runs the largest size once more under cProfile and writes the 25
   functions with the most own time to ``benchmarks/results/profile_<N>[_<tag>].txt``.

``--overrides`` apply to every run (the closed loop too). Results go to stdout and
``benchmarks/results/bench_default[_<tag>].json`` with the machine's load average at the start
and end of each run (other processes share the CPUs). Not a test: timings depend on the
machine.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import platform
import pstats
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from scipy import stats

HERE = Path(__file__).resolve().parent


def compose(overrides: list[str]):
    from hydra import compose as hydra_compose
    from hydra import initialize_config_module

    import conf.schema  # noqa: F401  (registers the config schemas)

    with initialize_config_module("conf", version_base=None):
        return hydra_compose("config", overrides=overrides)


def run_once(overrides: list[str], seed: int = 0) -> dict:
    """Build requests and simulate; wall times and the summary."""
    from analysis.metrics import summarize
    from scenarios import requests_for_seed
    from sim import simulate

    cfg = compose(overrides + [f"seed={seed}"])
    t0 = time.perf_counter()
    req = requests_for_seed(cfg.workload, seed)
    t1 = time.perf_counter()
    rec = simulate(cfg, req)
    t2 = time.perf_counter()
    s = summarize(rec, cfg.slo)
    return {"build_s": t1 - t0, "simulate_s": t2 - t1, "steps": s["num_steps"],
            "completed": s["completed"], "request_throughput": s["request_throughput"],
            "median_ttft_ms": s["median_ttft_ms"], "median_tpot_ms": s["median_tpot_ms"],
            "engine": s.get("engine"),
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def run_child(script: str, args: list[str]) -> dict:
    """Run ``script`` with ``args`` in a fresh process whose last stdout line is
    ``run_once``'s JSON; that dict with completed requests per wall second (build included)
    and the machine's load average before and after."""
    load_before = os.getloadavg()[0]
    out = subprocess.run([sys.executable, script, *args], check=True, capture_output=True,
                         text=True).stdout
    r = json.loads(out.strip().splitlines()[-1])
    r.update(requests_per_wall_s=r["completed"] / (r["build_s"] + r["simulate_s"]),
             load_average=[load_before, os.getloadavg()[0]])
    return r


def sustainable_rate(overrides: list[str]) -> float:
    """Request throughput of one replica kept saturated by a 1024-client closed loop."""
    r = run_once(["workload=closed_loop", "workload.concurrency=1024",
                  "workload.num_requests=8000"] + overrides)
    return r["request_throughput"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[10_000, 30_000, 100_000])
    ap.add_argument("--load", type=float, default=0.8)
    ap.add_argument("--overrides", nargs="*", default=[], help="config overrides of every run")
    ap.add_argument("--tag", default="", help="results file suffix")
    ap.add_argument("--profile", action="store_true", help="profile the largest size")
    ap.add_argument("--child", nargs=2, metavar=("N", "RATE"), help=argparse.SUPPRESS)
    ap.add_argument("--child-profile", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        n, rate = int(a.child[0]), float(a.child[1])
        overrides = ["workload=chat", f"workload.rate={rate}",
                     f"workload.num_requests={n}"] + a.overrides
        if a.child_profile:
            return profile(overrides, Path(a.child_profile))
        print(json.dumps(run_once(overrides)))
        return 0
    cap = sustainable_rate(a.overrides)
    rate = round(a.load * cap, 3)
    print(f"sustainable rate {cap:.2f} req/s; benchmarking at {a.load:.0%} = {rate} req/s")
    # numba compiles the loop (sim.compiled) on first use and caches it: a one-off that a
    # 200-request run pays here, so the measured runs find it cached
    subprocess.run([sys.executable, __file__, "--child", "200", str(rate), "--overrides",
                    *a.overrides], check=True, capture_output=True)
    rows = []
    for n in a.sizes:
        load_before = os.getloadavg()[0]
        out = subprocess.run([sys.executable, __file__, "--child", str(n), str(rate),
                              "--overrides", *a.overrides],
                             check=True, capture_output=True, text=True).stdout
        r = json.loads(out.strip().splitlines()[-1])
        r.update(num_requests=n, requests_per_wall_s=n / (r["build_s"] + r["simulate_s"]),
                 load_average=[load_before, os.getloadavg()[0]])
        rows.append(r)
        print(f"{n:>8} requests: simulate {r['simulate_s']:6.1f} s + build {r['build_s']:.1f} s, "
              f"{r['requests_per_wall_s']:7.0f} req/s, {r['steps']:>8} steps, "
              f"peak RSS {r['peak_rss_mb']:6.0f} MB, achieved {r['request_throughput']:.2f} "
              f"req/s, median TTFT {r['median_ttft_ms']:.0f} ms, TPOT {r['median_tpot_ms']:.1f}"
              f" ms, load {r['load_average'][0]:.2f}→{r['load_average'][1]:.2f}")
    fit = stats.linregress(np.log([r["num_requests"] for r in rows]),
                           np.log([r["simulate_s"] for r in rows])) if len(rows) > 1 else None
    if fit is not None:
        print(f"time ∝ N^{fit.slope:.3f} (1.0 = linear)")
    doc = {"machine": f"{platform.processor() or platform.machine()}, {platform.python_version()}",
           "cpus": os.cpu_count(), "overrides": a.overrides,
           "sustainable_rate": cap, "rate": rate, "load": a.load, "runs": rows,
           "time_exponent": None if fit is None else fit.slope}
    (HERE / "results").mkdir(exist_ok=True)
    name = f"bench_default_{a.tag}.json" if a.tag else "bench_default.json"
    (HERE / "results" / name).write_text(json.dumps(doc, indent=2) + "\n")
    if a.profile:
        n = max(a.sizes)
        path = HERE / "results" / f"profile_{n}{'_' + a.tag if a.tag else ''}.txt"
        subprocess.run([sys.executable, __file__, "--child", str(n), str(rate),
                        "--child-profile", str(path), "--overrides", *a.overrides], check=True)
        print(f"profile of {n} requests: {path}")
    return 0


def profile(overrides: list[str], path: Path) -> int:
    """Simulate under cProfile; the 25 functions with the most own time, and cumulative."""
    prof = cProfile.Profile()
    prof.enable()
    r = run_once(overrides)
    prof.disable()
    out = io.StringIO()
    out.write(f"cProfile of {' '.join(overrides)} (simulate {r['simulate_s']:.1f} s under the "
              f"profiler, {r['steps']} steps)\n")
    stats_ = pstats.Stats(prof, stream=out).strip_dirs()
    stats_.sort_stats("tottime").print_stats(25)
    stats_.sort_stats("cumulative").print_stats(25)
    path.write_text(out.getvalue())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
