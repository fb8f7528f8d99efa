"""Metrics hour by hour of a run whose traffic varies over time (``workload.rate_profile``):
the rate each hour offered and the latency its requests saw, the ramps included, which a
whole-run summary averages away."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from analysis.config import slo_is_set
from analysis.metrics import meets_slo, per_request_latencies


def hourly_metrics(requests: pd.DataFrame, hour_s: float, hours: int, slo=None,
                   span_s: float = math.inf) -> list[dict]:
    """One dict per hour ``0 .. hours − 1`` of ``hour_s`` seconds, the requests counted in
    the hour they arrived: ``arrivals``, ``offered_rate`` (req/s over the part of the hour
    inside the traffic's ``span_s``; 0 after it), ``completed``,
    ``rejected``, mean and p99 TTFT, p99 TPOT (ms; NaN without a completion) and, with an
    SLO, ``slo_attainment`` (requests meeting it over those that arrived and ended)."""
    hour = np.floor(requests["arrival_s"].to_numpy() / hour_s).astype(np.int64)
    lat = per_request_latencies(requests)
    lat_hour = np.floor(requests.loc[lat.index, "arrival_s"].to_numpy() / hour_s)
    good = meets_slo(lat, slo).to_numpy() if slo_is_set(slo) else None
    status = requests["status"].to_numpy()
    rows = []
    for h in range(hours):
        mine = lat_hour == h
        ttft, tpot = lat["ttft_ms"].to_numpy()[mine], lat["tpot_ms"].to_numpy()[mine]
        tpot = tpot[np.isfinite(tpot)]
        in_hour = hour == h
        offered_s = min((h + 1) * hour_s, span_s) - h * hour_s
        row = {"hour": h, "arrivals": int(in_hour.sum()),
               "offered_rate": float(in_hour.sum()) / offered_s if offered_s > 0 else 0.0,
               "completed": int(mine.sum()),
               "rejected": int((in_hour & (status == "rejected")).sum()),
               "mean_ttft_ms": float(ttft.mean()) if len(ttft) else math.nan,
               "p99_ttft_ms": float(np.percentile(ttft, 99)) if len(ttft) else math.nan,
               "p99_tpot_ms": float(np.percentile(tpot, 99)) if len(tpot) else math.nan}
        if good is not None:
            ended = int((in_hour & np.isin(status, ("completed", "rejected", "failed"))).sum())
            row["slo_attainment"] = int(good[mine].sum()) / ended if ended else math.nan
        rows.append(row)
    return rows


def format_hourly(rows: list[dict]) -> str:
    """``hourly_metrics`` as a text table, one line per hour."""
    frame = pd.DataFrame(rows).rename(columns={
        "offered_rate": "req/s", "mean_ttft_ms": "mean TTFT ms", "p99_ttft_ms": "p99 TTFT ms",
        "p99_tpot_ms": "p99 TPOT ms", "slo_attainment": "SLO attainment"})
    table = frame.to_string(index=False, float_format="{:.3g}".format)
    return f" Hour by hour (by arrival) \n{table}"
