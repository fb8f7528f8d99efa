"""Speed of the diffusion node pool: one day of the Alibaba text-to-image trace on 16 nodes.

    python benchmarks/bench_diffusion.py [--nodes 16] [--overrides cluster.policy=sjf]

Runs the busiest day of ``../shared/traces/alibaba_t2i_diffusion.csv`` (``workload=alibaba_t2i``:
SD3.5-large at 1024×1024 on H100s, the roofline job cost) under several pool settings, as
``python -m sim`` would (compose, validate, build the jobs, simulate, summarise), and reports
per setting the wall time of building the jobs and of simulating, and the run's main metrics.
The same day replayed 20× faster (``workload.time_scale=0.05``) loads the pool enough to queue.
Results go to stdout and ``benchmarks/results/bench_diffusion.json``. Not a test: timings
depend on the machine. The target: a day on 16 nodes simulates in under 30 s.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

from hydra import compose, initialize_config_module

import conf.schema  # noqa: F401  (registers the config schemas)
from analysis.diffusion_metrics import summarize_jobs
from cli.app import diffusion_jobs
from cli.validation import validate_config
from sim.diffusion.run import simulate_diffusion

HERE = Path(__file__).resolve().parent
SETTINGS = {
    "fcfs": [],
    "sjf": ["cluster.policy=sjf"],
    "priority_elastic": ["cluster.policy=priority", "cluster.elastic=true"],
    "batching_4": ["cluster.batching.max_images=4", "cluster.batching.max_wait_s=0.5"],
    "node_failures": ["cluster.failure.mtbf_s=21600", "cluster.failure.mttr_s=600",
                      "cluster.checkpointing=true"],
    "fcfs_20x": ["workload.time_scale=0.05"],
    "elastic_20x": ["workload.time_scale=0.05", "cluster.elastic=true"],
}
KEYS = ("jobs_completed", "jobs_failed", "jobs_per_hour", "images_per_hour", "gpu_utilization",
        "mean_job_latency_s", "p99_job_latency_s", "mean_job_queue_s", "num_job_preemptions",
        "num_job_restarts", "num_node_failures")


def run_once(overrides: list[str]) -> dict:
    """Compose, validate, build the jobs and simulate once; wall times and main metrics."""
    with initialize_config_module("conf", version_base=None):
        cfg = compose("config", overrides=overrides)
    validate_config(cfg)
    t0 = time.perf_counter()
    jobs = diffusion_jobs(cfg)
    t1 = time.perf_counter()
    records = simulate_diffusion(cfg, jobs)
    t2 = time.perf_counter()
    s = summarize_jobs(records)
    return {"jobs": len(jobs), "build_s": round(t1 - t0, 3), "simulate_s": round(t2 - t1, 3),
            "simulated_hours": round(records.meta["sim_time_s"] / 3600, 2),
            **{k: s[k] for k in KEYS}}


def main() -> int:
    """Run every setting of ``SETTINGS`` on the trace day (with ``--nodes`` and
    ``--overrides``), print one line each and write ``results/bench_diffusion.json``; 0."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=16)
    ap.add_argument("--overrides", nargs="*", default=[], help="more config overrides")
    a = ap.parse_args()
    base = ["workload=alibaba_t2i", "cluster=diffusion", f"cluster.nodes={a.nodes}",
            "hardware=h100_sxm", "backend=vllm", *a.overrides]
    results = {}
    for name, extra in SETTINGS.items():
        r = run_once(base + extra)
        results[name] = {"overrides": extra, **r}
        print(f"{name:>17}: {r['jobs']} jobs, build {r['build_s']:.2f} s, simulate "
              f"{r['simulate_s']:.2f} s; {r['jobs_per_hour']:.0f} jobs/h, GPU util "
              f"{r['gpu_utilization']:.3f}, mean latency {r['mean_job_latency_s']:.1f} s "
              f"(queue {r['mean_job_queue_s']:.2f} s), p99 {r['p99_job_latency_s']:.1f} s")
    doc = {"machine": f"{platform.processor() or platform.machine()}, {platform.python_version()}",
           "cpus": os.cpu_count(), "base_overrides": base, "runs": results}
    (HERE / "results").mkdir(exist_ok=True)
    (HERE / "results" / "bench_diffusion.json").write_text(json.dumps(doc, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
