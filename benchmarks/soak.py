"""Soak run: a million requests on a faulty cluster with every invariant checked.

    python benchmarks/soak.py [--requests 1000000] [--replicas 16] [--time-scale 0.08]
        [--trace ../shared/traces/azure2023_conv.csv] [--overrides ...] [--tag NAME]

The Azure 2023 conversation trace (19,366 requests over an hour) is looped until
``--requests`` requests, each loop starting where the previous one ended, with its gaps
multiplied by ``--time-scale`` (0.08: about 70 req/s, near what 16 replicas of the default
model sustain). Every request starts with one of 32 shared 1,024-token system prompts, so the
prefix cache has hits; a loop's own prompt blocks get fresh ids, so loops share only the
system prompts. The cluster: ``--replicas`` replicas behind the prefix-affinity router, prefix
caching, a KV cache small enough to preempt, replica failures (mean 1 h between failures per
replica, 2 min repairs, at most 3 retries per request), one straggler in eight running 1.5x
slower in 5-minute episodes, ``timeline=false`` (step totals, not a row per step), and
``check_invariants=true`` (``sim.engine.invariants``: KV accounting, batch limits, queue states,
timestamps, tokens and conservation after every step).

It ends by checking that every request is accounted for (completed, rejected with a reason or
failed with a reason) and reports wall time, peak and sampled resident memory (every 5% of the
requests: flat memory means the samples stop growing once the run is in steady state) to
stdout and ``benchmarks/results/soak[_<tag>].json``. Not a test: it takes many minutes.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
from bench_default import compose

from scenarios.prefixes import add_system_prompts

HERE = Path(__file__).resolve().parent
TRACE = HERE.parent.parent / "shared" / "traces" / "azure2023_conv.csv"
PAGE = os.sysconf("SC_PAGE_SIZE")


def rss_mb() -> float:
    """Resident memory of this process now (MB)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE / 2**20


class MemorySampler:
    """A progress object for ``sim.simulate``: samples resident memory every ``every``
    ended requests."""

    def __init__(self, every: int) -> None:
        self.every, self.ended, self.next = every, 0, every
        self.samples: list[tuple[int, float, float]] = []  # (ended, wall s, RSS MB)
        self.t0 = time.perf_counter()

    def update(self, n: int) -> None:
        self.ended += n
        if self.ended >= self.next:
            self.samples.append((self.ended, time.perf_counter() - self.t0, rss_mb()))
            self.next += self.every


def looped(base: pd.DataFrame, n: int) -> pd.DataFrame:
    """``n`` requests: ``base`` repeated, each loop after the last (one mean gap apart), and
    each loop's unshared hash ids (those of one request only) renamed so that loops share
    only what requests of one loop share."""
    arrival = base["arrival_time_s"].to_numpy()
    period = arrival[-1] + (arrival[-1] - arrival[0]) / max(len(base) - 1, 1)
    hashes = base["hash_ids"].tolist() if "hash_ids" in base else None
    if hashes is not None:
        ids, counts = np.unique(np.concatenate([np.asarray(h, np.int64) for h in hashes]),
                                return_counts=True)
        shared = set(ids[counts > 1].tolist())
        stride = int(ids.max()) + 1
    loops, parts = -(-n // len(base)), []
    for i in range(loops):
        part = base.copy()
        part["arrival_time_s"] = arrival + i * period
        if hashes is not None and i:
            part["hash_ids"] = [tuple(h if h in shared else h + i * stride for h in hs)
                                for hs in hashes]
        parts.append(part)
    return pd.concat(parts, ignore_index=True).iloc[:n]


def with_system_prompts(rows: pd.DataFrame, block_tokens: int, seed: int) -> pd.DataFrame:
    """The rows with one of 32 shared 1,024-token system prompts in front of each prompt (a
    trace brings no prefixes of its own; ``scenarios.prefixes`` names the blocks)."""
    sp = SimpleNamespace(count=32, tokens=1024, popularity="uniform", zipf_exponent=1.0)
    w = SimpleNamespace(system_prompt=sp, hash_block_tokens=block_tokens)
    return add_system_prompts(rows, w, np.random.default_rng(seed))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=1_000_000)
    ap.add_argument("--replicas", type=int, default=16)
    ap.add_argument("--time-scale", type=float, default=0.08)
    ap.add_argument("--trace", type=Path, default=TRACE)
    ap.add_argument("--overrides", nargs="*", default=[], help="more config overrides")
    ap.add_argument("--tag", default="", help="results file suffix")
    a = ap.parse_args()
    if not a.trace.is_file():
        print(f"no trace at {a.trace} (the shared data is not next to this checkout)",
              file=sys.stderr)
        return 2
    from analysis.metrics import step_metrics
    from scenarios import requests_for_seed
    from sim import simulate

    overrides = [
        "workload=trace", f"workload.trace_path={a.trace.resolve()}",
        f"workload.time_scale={a.time_scale}", f"cluster.replicas={a.replicas}",
        "cluster.router=prefix_affinity", "kv_cache.prefix_caching=true",
        "kv_cache.num_gpu_blocks=1500", "cluster.failure.mtbf_s=3600",
        "cluster.failure.mttr_s=120", "cluster.failure.max_retries=3",
        "cluster.straggler.fraction=0.125", "cluster.straggler.factor=1.5",
        "cluster.straggler.mtbs_s=1800", "cluster.straggler.duration_s=300",
        "check_invariants=true", "timeline=false", "plots=false", "progress=false",
        *a.overrides]
    cfg = compose(overrides)
    t0 = time.perf_counter()
    trace = requests_for_seed(cfg.workload, cfg.seed)
    requests = looped(with_system_prompts(trace, cfg.cluster.prefix_block_tokens, cfg.seed),
                      a.requests)
    t1 = time.perf_counter()
    sampler = MemorySampler(max(a.requests // 20, 1))
    records = simulate(cfg, requests, progress=sampler)
    t2 = time.perf_counter()
    req = records.requests
    status = req["status"].value_counts().to_dict()
    ended = {"completed", "rejected", "failed"}
    unaccounted = int((~req["status"].isin(ended)).sum())
    reasons = {}
    for st, col in (("rejected", "reject_reason"), ("failed", "fail_reason")):
        if col in req:
            rows = req.loc[req["status"] == st, col]
            reasons[st] = rows.value_counts().to_dict()
            unaccounted += int((rows == "").sum())  # ended without a reason
    meta = records.meta
    doc = {
        "machine": f"{platform.processor() or platform.machine()}, "
                   f"{platform.python_version()}", "cpus": os.cpu_count(),
        "overrides": overrides, "requests": len(req), "status": status, "reasons": reasons,
        "unaccounted": unaccounted, "build_s": t1 - t0, "simulate_s": t2 - t1,
        "requests_per_wall_s": len(req) / (t2 - t0), "sim_time_s": meta.get("sim_time_s"),
        "steps": step_metrics(records.timeline, meta)["num_steps"],
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "rss_samples": [{"ended": e, "wall_s": round(w, 1), "rss_mb": round(m, 1)}
                        for e, w, m in sampler.samples],
        "faults": {k: v for k, v in meta.items() if "fail" in k or "straggl" in k
                   or "fault" in k},
        "invariant_checks": meta.get("invariant_checks"),
        "cached_token_fraction": float(req["cached_tokens"].sum() / req["input_tokens"].sum()),
        "num_preemptions": int(req["num_preemptions"].sum()),
        "num_retries": int(req["num_retries"].sum()),
    }
    print(json.dumps({k: v for k, v in doc.items() if k != "rss_samples"}, indent=1,
                     default=str))
    print("RSS (MB) every 5%:", [s["rss_mb"] for s in doc["rss_samples"]])
    (HERE / "results").mkdir(exist_ok=True)
    name = f"soak_{a.tag}.json" if a.tag else "soak.json"
    (HERE / "results" / name).write_text(json.dumps(doc, indent=2, default=str) + "\n")
    return 0 if unaccounted == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
