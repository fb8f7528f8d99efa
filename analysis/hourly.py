"""Metrics hour by hour of a run whose traffic varies over time (``workload.rate_profile``):
the rate each hour offered and the latency its requests saw, the ramps included, which a
whole-run summary averages away."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from analysis.config import slo_is_set
from analysis.metrics import meets_slo, per_request_latencies


def _arrival_rows(arrival_s: np.ndarray, status: np.ndarray, hour_s: float, hours: int,
                  span_s: float) -> list[dict]:
    """Per hour: ``hour``, ``arrivals``, ``offered_rate`` (per second over the part of the
    hour inside the traffic's ``span_s``; 0 after it), ``completed`` and ``rejected``, by
    arrival."""
    hour = np.floor(arrival_s / hour_s).astype(np.int64)
    inside = (hour >= 0) & (hour < hours)

    def count(mask: np.ndarray) -> np.ndarray:
        return np.bincount(hour[inside & mask], minlength=hours)

    arrivals = count(np.ones(len(hour), bool))
    completed, rejected = count(status == "completed"), count(status == "rejected")
    rows = []
    for h in range(hours):
        offered_s = min((h + 1) * hour_s, span_s) - h * hour_s
        rows.append({"hour": h, "arrivals": int(arrivals[h]),
                     "offered_rate": float(arrivals[h]) / offered_s if offered_s > 0 else 0.0,
                     "completed": int(completed[h]), "rejected": int(rejected[h])})
    return rows


def hourly_job_metrics(jobs: pd.DataFrame, hour_s: float, hours: int,
                       span_s: float = math.inf) -> list[dict]:
    """``hourly_metrics`` of diffusion jobs (``jobs.parquet``), counted in the hour they
    arrived: ``arrivals``, ``offered_rate`` (jobs/s), ``completed``, ``rejected``, and the
    mean and p99 job latency (s, arrival to completion; NaN without a completion)."""
    arrival = jobs["arrival_s"].to_numpy(float)
    status = jobs["status"].to_numpy()
    done = status == "completed"
    latency = (jobs["completion_s"].to_numpy(float) - arrival)[done]
    done_hour = np.floor(arrival[done] / hour_s)
    rows = _arrival_rows(arrival, status, hour_s, hours, span_s)
    for row in rows:
        mine = latency[done_hour == row["hour"]]
        row["mean_latency_s"] = float(mine.mean()) if len(mine) else math.nan
        row["p99_latency_s"] = float(np.percentile(mine, 99)) if len(mine) else math.nan
    return rows


def hourly_metrics(requests: pd.DataFrame, hour_s: float, hours: int, slo=None,
                   span_s: float = math.inf) -> list[dict]:
    """One dict per hour ``0 .. hours − 1`` of ``hour_s`` seconds, the requests counted in
    the hour they arrived: ``arrivals``, ``offered_rate`` (req/s over the part of the hour
    inside the traffic's ``span_s``; 0 after it), ``completed``,
    ``rejected``, mean and p99 TTFT, p99 TPOT (ms; NaN without a completion) and, with an
    SLO, ``slo_attainment`` (requests meeting it over those that arrived and ended)."""
    arrival = requests["arrival_s"].to_numpy()
    hour = np.floor(arrival / hour_s).astype(np.int64)
    lat = per_request_latencies(requests)
    lat_hour = np.floor(requests.loc[lat.index, "arrival_s"].to_numpy() / hour_s)
    good = meets_slo(lat, slo).to_numpy() if slo_is_set(slo) else None
    status = requests["status"].to_numpy()
    rows = _arrival_rows(arrival, status, hour_s, hours, span_s)
    for h, row in enumerate(rows):
        mine = lat_hour == h
        ttft, tpot = lat["ttft_ms"].to_numpy()[mine], lat["tpot_ms"].to_numpy()[mine]
        tpot = tpot[np.isfinite(tpot)]
        in_hour = hour == h
        row.update({
            "mean_ttft_ms": float(ttft.mean()) if len(ttft) else math.nan,
            "p99_ttft_ms": float(np.percentile(ttft, 99)) if len(ttft) else math.nan,
            "p99_tpot_ms": float(np.percentile(tpot, 99)) if len(tpot) else math.nan})
        if good is not None:
            ended = int((in_hour & np.isin(status, ("completed", "rejected", "failed"))).sum())
            row["slo_attainment"] = int(good[mine].sum()) / ended if ended else math.nan
    return rows


def format_hourly(rows: list[dict]) -> str:
    """``hourly_metrics`` as a text table, one line per hour."""
    jobs = "mean_latency_s" in rows[0] if rows else False
    frame = pd.DataFrame(rows).rename(columns={
        "offered_rate": "jobs/s" if jobs else "req/s", "mean_ttft_ms": "mean TTFT ms",
        "p99_ttft_ms": "p99 TTFT ms", "p99_tpot_ms": "p99 TPOT ms",
        "slo_attainment": "SLO attainment", "mean_latency_s": "mean latency s",
        "p99_latency_s": "p99 latency s"})
    table = frame.to_string(index=False, float_format="{:.3g}".format)
    return f" Hour by hour (by arrival) \n{table}"
