"""A run whose traffic follows a daily curve, read hour by hour (``analysis.hourly``)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from analysis.hourly import format_hourly, hourly_metrics
from analysis.metrics import per_request_latencies
from analysis.stats import t_interval
from scenarios import requests_for_seed
from sim import simulate

HOURS = [0.3, 0.9, 0.6]  # multipliers of the peak, one per (compressed) hour
PEAK, HOUR_S = 5.0, 400.0  # req/s: one H100 serves Llama-3.1-8B chat up to about 6


def batch_mean(ttft_ms: np.ndarray, batches: int = 20):
    """Mean TTFT and its 99% half-width by batch means (a queue's TTFTs are correlated)."""
    n = len(ttft_ms) // batches * batches
    return t_interval(ttft_ms[:n].reshape(batches, -1).mean(axis=1), level=0.99)


def test_a_day_on_fixed_replicas_matches_steady_runs_at_each_hours_rate(compose_cfg):
    """One replica under a 3-hour profile (hours of 400 s): each hour's mean TTFT lies
    within the confidence intervals of a steady-state run at that hour's rate (independent
    seeds), and the hours differ from one another (the profile is not averaged away)."""
    over = ("workload=chat", f"workload.rate={PEAK}", "slo=none")
    day = compose_cfg(*over, f"workload.rate_profile.hourly={HOURS}",
                      f"workload.rate_profile.hour_s={HOUR_S}")
    req = simulate(day, requests_for_seed(day.workload, 1)).requests
    lat = per_request_latencies(req)
    hour = np.floor(req.loc[lat.index, "arrival_s"].to_numpy() / HOUR_S)
    means = []
    for h, weight in enumerate(HOURS):
        # the hour's first minute follows the previous hour's load: leave it out
        t0 = req.loc[lat.index, "arrival_s"].to_numpy() - h * HOUR_S
        varying = batch_mean(lat["ttft_ms"].to_numpy()[(hour == h) & (t0 >= 60)])
        steady_cfg = compose_cfg(*over, f"workload.rate={PEAK * weight}",
                                 f"workload.num_requests={int(PEAK * weight * 2 * HOUR_S)}",
                                 "seed=7")
        steady_req = simulate(steady_cfg, requests_for_seed(steady_cfg.workload, 7)).requests
        steady_lat = per_request_latencies(steady_req)
        warm = steady_req.loc[steady_lat.index, "arrival_s"].to_numpy() >= 60
        steady = batch_mean(steady_lat["ttft_ms"].to_numpy()[warm])
        gap = abs(varying.mean - steady.mean)
        assert gap <= np.hypot(varying.half_width, steady.half_width), (h, varying, steady)
        means.append(varying)
    low, high = means[0], means[1]  # 1.5 against 4.5 req/s
    assert high.mean - low.mean > high.half_width + low.half_width


def test_hourly_rows_count_each_request_in_the_hour_it_arrived():
    req = pd.DataFrame({
        "request_id": [0, 1, 2, 3], "arrival_s": [0.5, 1.5, 1.9, 3.5],
        "first_token_s": [0.6, 1.9, np.nan, 3.6], "completion_s": [1.0, 2.3, np.nan, 3.7],
        "generated_tokens": [5, 5, 0, 1],
        "status": ["completed", "completed", "rejected", "completed"]})

    class SLO:
        ttft_ms, tpot_ms, e2el_ms = 200.0, None, None

    rows = hourly_metrics(req, 1.0, 4, SLO(), span_s=3.5)
    assert [r["arrivals"] for r in rows] == [1, 2, 0, 1]
    assert [r["completed"] for r in rows] == [1, 1, 0, 1]
    assert rows[1]["rejected"] == 1 and rows[1]["offered_rate"] == 2.0
    assert rows[1]["mean_ttft_ms"] == pytest.approx(400.0)
    assert rows[0]["slo_attainment"] == 1.0 and rows[1]["slo_attainment"] == 0.0
    assert np.isnan(rows[2]["slo_attainment"]) and np.isnan(rows[2]["mean_ttft_ms"])
    assert np.isnan(rows[3]["p99_tpot_ms"])  # one token: no TPOT
    assert rows[3]["offered_rate"] == 2.0  # one arrival in the half hour of the span
    assert len(format_hourly(rows).splitlines()) == 6
