"""Steady-state metrics of one run: the warm-up that MSER-5 finds in the TTFT series, and the
vLLM-named latency, throughput and goodput metrics of the requests that arrive after it.

A simulation starts with an empty server, so its first requests see less queueing than the
system's steady state. ``warmup_cut`` orders completed requests by arrival and applies MSER-5
(``analysis.stats.mser``) to their TTFTs; ``steady_metrics`` then measures only the requests
that arrived at or after the cut. Only the start is trimmed: an open-loop run's last requests
still compete with every request that arrived before them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from analysis.config import slo_is_set
from analysis.metrics import meets_slo, per_request_latencies, value_stats
from analysis.stats import mser

LATENCIES = ("ttft_ms", "tpot_ms", "e2el_ms", "wait_ms")
STATS = (("mean", None), ("median", 50), ("p90", 90), ("p99", 99))
THROUGHPUTS = ("request_throughput", "output_throughput", "total_token_throughput")
GOODPUT = ("request_goodput", "slo_attainment")
# every metric steady_metrics can return; "higher" ones are better when larger
STEADY_METRICS = (*(f"{s}_{n}" for n in LATENCIES for s, _ in STATS), *THROUGHPUTS,
                  *GOODPUT, "median_tps", "completed", "rejected", "failed")
HIGHER_IS_BETTER = (*THROUGHPUTS, *GOODPUT, "median_tps", "completed",
                    "output_throughput_per_gpu")


@dataclass(frozen=True)
class WarmUp:
    """The warm-up of one run: requests dropped (by arrival order), the arrival time from
    which requests count, and whether MSER-5 found the series settled (see ``stats.mser``)."""

    dropped: int
    cut_s: float
    settled: bool
    rule: str


def latencies(requests: pd.DataFrame) -> pd.DataFrame:
    """Per completed request: arrival, TTFT, TPOT, E2E latency and the wait before its first
    step (``wait_ms``: first scheduled − arrival), in arrival order."""
    lat = per_request_latencies(requests)
    done = requests.loc[lat.index]
    lat = lat.assign(arrival_s=done["arrival_s"],
                     wait_ms=(done["first_scheduled_s"] - done["arrival_s"]) * 1e3)
    return lat.sort_values("arrival_s", kind="stable")


def warmup_cut(requests: pd.DataFrame, warmup: str | float = "auto") -> WarmUp:
    """The warm-up of a run: ``auto`` applies MSER-5 to the TTFT series in arrival order;
    a number of seconds cuts at that time after the first arrival."""
    start = float(requests["arrival_s"].min()) if len(requests) else 0.0
    if warmup != "auto":
        cut = start + float(warmup)
        n = int((requests["arrival_s"] < cut).sum())
        return WarmUp(n, cut, True, f"fixed {float(warmup):g} s")
    lat = latencies(requests)
    t = mser(lat["ttft_ms"].to_numpy())
    cut = float(lat["arrival_s"].iloc[t.drop]) if t.drop and len(lat) else start
    return WarmUp(t.drop, cut, t.settled, "MSER-5 on TTFT")


def _latency_stats(lat: pd.DataFrame) -> dict:
    out = {}
    for name in LATENCIES:
        out.update(value_stats(name, lat[name].to_numpy(float)))
    return out


def steady_metrics(requests: pd.DataFrame, cut_s: float, slo=None) -> dict:
    """Metrics of the requests that arrived at or after ``cut_s`` (names of
    ``STEADY_METRICS``): latency statistics, and throughputs over the span from ``cut_s``
    to the last completion among them."""
    req = requests[requests["arrival_s"] >= cut_s]
    lat = latencies(req)
    done = req.loc[lat.index]
    rejected = int((req["status"] == "rejected").sum())
    failed = int((req["status"] == "failed").sum())
    span = float(done["completion_s"].max() - cut_s) if len(done) else 0.0
    rate = (lambda x: x / span) if span > 0 else (lambda x: float("nan"))
    out = {"completed": len(lat), "rejected": rejected, "failed": failed,
           "request_throughput": rate(len(lat)),
           "output_throughput": rate(float(done["generated_tokens"].sum())),
           "total_token_throughput": rate(float(done["generated_tokens"].sum()
                                                + done["input_tokens"].sum()))}
    out.update(_latency_stats(lat))
    tpot = lat["tpot_ms"].to_numpy(float)
    tpot = tpot[np.isfinite(tpot) & (tpot > 0)]
    out["median_tps"] = float(np.median(1e3 / tpot)) if len(tpot) else float("nan")
    if slo_is_set(slo):
        good = int(meets_slo(lat, slo).sum())
        total = len(lat) + rejected + failed
        out["request_goodput"] = rate(good)
        out["slo_attainment"] = good / total if total else float("nan")
    return out
