"""Searches of the capacity plan: does a deployment meet the SLO at a rate (one set of
simulations), the largest rate one replica sustains (bracketing, then bisection), and the
fewest replicas that hold a rate (verified on the simulated cluster with its router).

The search is monotone, not a grid: each seed's arrivals at rate ``r`` are the same
exponential (or Gamma) gaps scaled by ``1/r`` and its lengths are the same, so a higher rate
only packs the same requests closer together.
"""

from __future__ import annotations

import copy
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from omegaconf import open_dict

from analysis.capacity_config import LOWER_BOUNDED
from analysis.inputs import check_warmup
from analysis.steady import steady_metrics, throughput_ratio, warmup_cut
from scenarios import requests_for_seed
from sim.engine.run import simulate

log = logging.getLogger("capacity")
# metrics every evaluation reports, besides those its SLO bounds
REPORTED = ("request_throughput", "p99_ttft_ms", "p99_tpot_ms", "mean_wait_ms",
            "slo_attainment", "throughput_ratio", "warmup_dropped", "completed")


@dataclass
class Evaluation:
    """Simulations of one deployment at one rate: its metrics (mean over seeds), whether it
    meets every bound, and by how much the worst bound is missed (> 1 misses)."""

    rate: float
    replicas: int
    metrics: dict
    ok: bool
    violations: list[str]
    worst: float

    def as_dict(self, slo: dict | None = None) -> dict:
        """JSON-ready form, with the metrics of ``slo`` and a few that describe the load."""
        keep = {*(slo or {}), *REPORTED}
        return {"rate": self.rate, "replicas": self.replicas, "ok": self.ok,
                "violations": self.violations, "worst_ratio": self.worst,
                "metrics": {k: v for k, v in self.metrics.items() if k in keep}}


def judge(metrics: dict, slo: dict, min_throughput_ratio: float,
          ) -> tuple[bool, list[str], float]:
    """Whether ``metrics`` meet every bound of ``slo`` and keep up with the offered load;
    the missed bounds as text; the worst ratio of value to bound (inverted for lower
    bounds)."""
    missed, worst = [], 0.0
    checks = [(m, float(b), m in LOWER_BOUNDED) for m, b in slo.items()]
    checks.append(("throughput_ratio", min_throughput_ratio, True))
    for m, bound, lower in checks:
        v = metrics.get(m, float("nan"))
        ratio = (bound / v if v > 0 else math.inf) if lower else v / bound
        ratio = math.inf if not math.isfinite(ratio) else ratio
        worst = max(worst, ratio)
        if ratio > 1:
            missed.append(f"{m}={v:.4g} {'<' if lower else '>'} {bound:g}")
    return not missed, missed, worst


def _mean(values: list[float]) -> float:
    """Mean of the finite values (NaN when none: e.g. TPOT of one-token outputs)."""
    v = np.asarray(values, float)
    v = v[np.isfinite(v)]
    return float(v.mean()) if len(v) else float("nan")


class Evaluator:
    """Runs (and caches) the simulations of ``cfg`` at a rate and a replica count."""

    def __init__(self, cfg, slo: dict, seeds, warmup, min_throughput_ratio: float) -> None:
        self.cfg, self.slo, self.seeds = cfg, dict(slo), [int(s) for s in seeds]
        self.warmup = warmup if warmup == "auto" else float(warmup)
        self.min_ratio = float(min_throughput_ratio)
        self.cache: dict[tuple, Evaluation] = {}

    @property
    def simulations(self) -> int:
        """Simulations run so far."""
        return len(self.cache) * len(self.seeds)

    def __call__(self, rate: float, replicas: int = 1, num_requests: int | None = None,
                 ) -> Evaluation:
        n = int(num_requests or self.cfg.workload.num_requests)
        key = (round(rate, 12), replicas, n)
        if key in self.cache:
            return self.cache[key]
        cfg = copy.deepcopy(self.cfg)
        with open_dict(cfg):
            cfg.workload.rate = float(rate)
            cfg.workload.num_requests = n
            cfg.cluster.replicas = int(replicas)
            if "autoscaler" in cfg.cluster:  # a fixed count (capacity.day scales the days)
                cfg.cluster.autoscaler.policy = "none"
            cfg.timeline = False  # the search reads request rows only
        runs = []
        for seed in self.seeds:
            cfg.seed = seed
            req = simulate(cfg, requests_for_seed(cfg.workload, seed)).requests
            cut = warmup_cut(req, self.warmup)
            if self.warmup != "auto":
                check_warmup(req, cut.cut_s, "capacity.search.warmup", self.warmup,
                             f"the simulation at {rate:.4g} req/s on {replicas} replica(s), "
                             f"seed {seed}")
            m = steady_metrics(req, cut.cut_s, cfg.slo)
            m["throughput_ratio"] = throughput_ratio(req, cut.cut_s)
            m["warmup_dropped"] = cut.dropped
            runs.append(m)
        metrics = {k: _mean([r[k] for r in runs]) for k in runs[0]}
        ok, missed, worst = judge(metrics, self.slo, self.min_ratio)
        e = Evaluation(float(rate), int(replicas), metrics, ok, missed, worst)
        self.cache[key] = e
        log.info("%8.4g req/s on %d replica(s): %s", rate, replicas,
                 "meets the SLO" if ok else "misses: " + "; ".join(missed))
        return e


@dataclass
class RateSearch:
    """The result of a maximum-rate search: the largest rate found to meet the SLO (None if
    none did), the bracket it ended with, and every evaluation in order."""

    rate: float | None
    low: float | None
    high: float | None
    evaluations: list[Evaluation] = field(default_factory=list)

    def best(self) -> Evaluation:
        """The evaluation closest to meeting the SLO (the passing one at the highest rate)."""
        ok = [e for e in self.evaluations if e.ok]
        if ok:
            return max(ok, key=lambda e: e.rate)
        return min(self.evaluations, key=lambda e: (e.worst, -e.rate))


def max_rate(evaluate: Callable[[float], Evaluation], start: float, rel_tol: float,
             min_rate: float, max_rate_: float, max_evaluations: int) -> RateSearch:
    """The largest rate that ``evaluate`` finds to meet the SLO: double (or quarter) from
    ``start`` until a passing rate and a failing rate bracket it, then bisect geometrically
    until ``high / low − 1 <= rel_tol``. Stops early at ``max_evaluations``; gives up
    (``rate=None``) when even ``min_rate`` fails."""
    evals: list[Evaluation] = []

    def ev(r: float) -> Evaluation:
        e = evaluate(r)
        evals.append(e)
        return e

    lo = hi = None
    r = min(max(start, min_rate), max_rate_)
    if ev(r).ok:
        lo = r
        while hi is None and len(evals) < max_evaluations:
            if lo >= max_rate_:
                return RateSearch(lo, lo, None, evals)
            r = min(lo * 2, max_rate_)
            if ev(r).ok:
                lo = r
            else:
                hi = r
    else:
        hi = r
        while lo is None and len(evals) < max_evaluations:
            if hi <= min_rate:
                return RateSearch(None, None, hi, evals)
            r = max(hi / 4, min_rate)
            if ev(r).ok:
                lo = r
            else:
                hi = r
    while lo is not None and hi is not None and hi / lo - 1 > rel_tol \
            and len(evals) < max_evaluations:
        mid = math.sqrt(lo * hi)
        if ev(mid).ok:
            lo = mid
        else:
            hi = mid
    return RateSearch(lo, lo, hi, evals)


@dataclass
class ReplicaPlan:
    """The fewest replicas found to hold a rate, with the evaluation at that size and at one
    fewer (which must miss the SLO for the count to be verified)."""

    replicas: int
    verified: bool
    at_size: Evaluation | None
    one_fewer: Evaluation | None
    note: str = ""


def replicas_for(evaluate: Callable[[float, int], Evaluation], rate: float, estimate: int,
                 max_adjustments: int) -> ReplicaPlan:
    """Starting from ``estimate`` replicas, add replicas until the cluster meets the SLO at
    ``rate``, or remove them while it still does; verified when N meets it and N − 1 does
    not (N = 1 needs no second check)."""
    n = max(1, int(estimate))
    e = evaluate(rate, n)
    steps = 0
    while not e.ok and steps < max_adjustments:
        n, steps = n + 1, steps + 1
        e = evaluate(rate, n)
    if not e.ok:
        return ReplicaPlan(n, False, e, None,
                           f"still misses the SLO with {n} replicas after {steps} additions")
    fewer = evaluate(rate, n - 1) if n > 1 else None
    while fewer is not None and fewer.ok and steps < max_adjustments:
        n, e, steps = n - 1, fewer, steps + 1
        fewer = evaluate(rate, n - 1) if n > 1 else None
    if fewer is not None and fewer.ok:
        return ReplicaPlan(n, False, e, fewer, f"{n - 1} replicas still meet the SLO; "
                           "stopped after the adjustment limit")
    return ReplicaPlan(n, True, e, fewer)
